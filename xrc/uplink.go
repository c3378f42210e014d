package xrc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/verbs"
	"github.com/goxrc/goxrc/xrc/internal/wire"
)

// upState is an uplink's state (xrc-protocol.md, "Active side").
type upState uint8

const (
	upNone       upState = iota // gone (or never made)
	upConnecting                // the PHYS_REQ is out; dials queue
	upUp                        // an INI connected to a TGT: dials send VIRT_REQs
	upRecovering                // the INI failed; legs are moving to a new one; dials and sends queue
)

func (s upState) String() string {
	return [...]string{"NONE", "CONNECTING", "UP", "RECOVERING"}[s]
}

// uplink is this process's way to one remote node and domain: one INI QP at
// a time, shared by every leg we send there.
type uplink struct {
	node    netip.Addr
	dom     uint64 // 0 until the first ACCEPT
	state   upState
	changed chan struct{} // closed at every state change
	cur     *iniQP        // the INI sends go on (UP)
	inis    []*iniQP      // every INI not yet destroyed (cur and retired ones)
	refs    int           // legs sending over the uplink, and dials in progress
	legs    map[*Conn]struct{}
	// gone counts recoveries in a row whose new TGT died under them (see
	// recover): past maxGoneRounds a leg refused TGT_GONE fails.
	gone int
	// settling: the recovery that made cur has not ended: some legs'
	// MOVEs may be under way (those legs are Conn.unmoved), the old link
	// not disconnected yet. A failure of cur meanwhile puts u back to
	// RECOVERING, and that recovery starts the next as it ends (see
	// failINILocked).
	settling bool
	// pollFails counts the recoveries in a row started by a failed send
	// poll, with no completion taken since: a poll that fails again on
	// the INI the last one made is the CQ's or the device's failure, not
	// the INI's, and another recovery would fail as fast, round after
	// round (see failINILocked). Such a recovery's resends carry a
	// keepalive, or a probe (Conn.resend): a working poll takes a
	// completion.
	pollFails int
	// kept: old INIs whose physical links a recovery left up, for a leg
	// whose MOVE was refused TGT_GONE: its receiver still has it on
	// their TGT until the next round moves it, and the link's DREQ would
	// tell the receiver, if it made that TGT, that we are gone. A round
	// that leaves no leg behind disconnects them with its own old link.
	kept []*iniQP
	// refuted: a dial was refused TGT_GONE naming u's domain again onto
	// the TGT a rebuild had just made. The domain is a PHYS ACCEPT's word,
	// which nothing checks: a process may name its neighbour's, so that
	// every dial to the neighbour rides its TGT (a review's finding,
	// TestPhysAcceptClaimingNeighbourDomain). New dials pass u over
	// (uplinkForLocked) and make their own; u's legs stay on it.
	refuted bool
}

// pokeLocked wakes whoever waits on u.changed without a change of state:
// a leg of an UP uplink was moved onto its INI (see recover).
func (u *uplink) pokeLocked() {
	close(u.changed)
	u.changed = make(chan struct{})
}

const maxGoneRounds = 8

// hasOpenLeg reports whether a leg on u is not closing. Each open leg's
// receiver holds the TGT; once every leg is closing, their FINs may already
// have ended those registrations, and with the last the TGT, while u is
// still up: a reverse leg bound to u then would name a dead TGT
// (TestEndpointDialAcceptorClosesAtOnce).
func (u *uplink) hasOpenLeg() bool {
	for c := range u.legs {
		// An unmoved leg's receiver does not hold cur's TGT yet.
		if !c.closing && !c.unmoved {
			return true
		}
	}
	return false
}

// iniQP is one INI with its physical CM connection.
type iniQP struct {
	qp      kernel.QP
	num     uint32
	aid     kernel.ID // the XRC-typed CM id, established
	tgt     uint32    // the TGT it is connected to
	nextWR  uint64
	waiters map[uint64]waiter
	// room is closed and replaced when completions free send-queue slots
	// and a sender waits for them (roomWait): a post that found the queue
	// full (ENOMEM) waits on it and posts again.
	room     chan struct{}
	roomWait bool
	// polls counts the completions the poller has taken. A post that
	// found the queue full while polls stayed what it was when the post
	// began has a completion coming (its slot frees the queue) and waits
	// for room; if polls moved, a slot is free already and it posts again
	// at once. Counting registered waiters instead misleads: other
	// senders' frames that found the queue full are registered too, and
	// all of them waited for a completion none of them would bring.
	polls   uint64
	broken  bool  // failed while its uplink was recovering onto it
	pollErr error // its send poll failed: nothing hears its completions
	// erred: a send on it completed in error, not flushed. Only then do its
	// frames count a try when sent again (Conn.resend): a rebuild for a
	// TGT_GONE, a DREQ or a full send queue is no failure of theirs, and
	// a dial to a liar would otherwise use up a healthy stream's tries.
	erred bool
	// ending: endINI has begun destroying it (its TIMEWAIT_EXIT, or a
	// DREQ the kernel refused), once.
	ending bool
	// goneCounted: a MOVE onto it was refused TGT_GONE, counted in
	// uplink.gone (once, however many legs were refused).
	goneCounted bool
}

// awaitRoomLocked returns what a sender that found q's send queue full
// (ENOMEM) waits on: closed once the poller has taken completions.
func (e *Endpoint) awaitRoomLocked(q *iniQP) <-chan struct{} {
	q.roomWait = true
	e.sqFull.Add(1)
	return q.room
}

// roomLocked wakes the senders waiting for q's send queue to drain.
func (q *iniQP) roomLocked() {
	if q.roomWait {
		q.roomWait = false
		close(q.room)
		q.room = make(chan struct{})
	}
}

type waiter struct {
	c    *Conn
	ch   chan verbs.WCStatus // internal frames: the sender's; nil: fire and forget (keepalives)
	seq  uint32              // data frames: the number
	data bool
	// probe: a dial's keepalive before its reverse leg is up, which
	// the receiver takes for no first frame (see Conn.post).
	probe bool
}

func (u *uplink) setState(s upState) {
	u.state = s
	close(u.changed)
	u.changed = make(chan struct{})
}

// req starts a REQ from c.
func (e *Endpoint) req(c *Conn, t wire.Type, peerTag uint32) wire.Req {
	r := wire.Req{Type: t, ConnTag: c.sendTag, Incarnation: e.inc, SRQN: e.srqn, ReplyPort: e.addr.Port(),
		Credits: uint16(e.cfg.RecvWindow), MaxMessage: uint32(e.cfg.MaxMessageSize)}
	if peerTag != 0 {
		r.Flags, r.PeerTag = wire.FlagReciprocal, peerTag
	}
	return r
}

// moveReq makes r a MOVE of c's leg, numbered one past its last.
func (c *Conn) moveReq(r *wire.Req) {
	r.Flags |= wire.FlagMove
	r.Move = c.moves.Add(1)
}

// openLeg opens c's sending leg to c.raddr: over the uplink to that node
// and domain if there is one (a VIRT_REQ over SIDR), else by making the
// uplink (a PHYS_REQ over the XRC-typed CM exchange). peerTag is non-zero
// for a reverse leg.
func (e *Endpoint) openLeg(ctx context.Context, c *Conn, peerTag uint32) error {
	raddr := c.raddr
	// moving: the peer accepted the leg, but over an uplink that then went
	// or was rebuilt (its recovery had no leg of its own to move), so it
	// holds the leg on a TGT we may no longer reach: what follows moves it
	// (MOVE), as recover moves a bound leg.
	var moving bool
	var last error // the last failure, for errLegTries
	// rebuilt: the uplinks a TGT_GONE had this dial rebuild (free of an
	// attempt, once for each uplink: another dial's, made since, is not
	// one whose rebuild a second refusal would prove a lie about). All of
	// them, not the last: a dial riding two uplinks by turns (one up
	// while the other recovers) rebuilt each again and again
	// (TestEndpointLyingTGTGoneTwoUplinksBounded).
	var rebuilt []*uplink
	for attempt := 0; attempt < 16; attempt++ {
		e.mu.Lock()
		if e.closed || c.failed() {
			e.mu.Unlock()
			return c.errOr(ErrClosed)
		}
		u := e.uplinkForLocked(raddr)
		if u == nil {
			u = &uplink{node: raddr.Addr(), state: upConnecting, changed: make(chan struct{}), legs: map[*Conn]struct{}{}, refs: 1}
			e.uplinks = append(e.uplinks, u)
			key := upKey{nodeKey(raddr).Addr(), e.domainOfLocked(raddr)}
			req := e.req(c, wire.TypePhysReq, peerTag)
			if moving {
				c.moveReq(&req)
			}
			if old := e.replaced[key]; old != 0 {
				req.Flags |= wire.FlagReplacesTGT
				req.TGTQPNHint = old
			}
			e.mu.Unlock()
			q, acc, err := e.physLink(ctx, raddr, &req)
			e.mu.Lock()
			if err == nil {
				e.iniSetup-- // q joins u.inis below, or goes
			}
			if err == nil && e.closed {
				// Close began while we connected. It releases the INIs it
				// finds on the uplinks, which this one never joined, so
				// its CM id and QP are ours to end (destroying the id
				// sends the DREQ that frees the peer's stale entry).
				e.k.DestroyID(q.aid)
				e.k.DestroyQP(q.qp)
				err = ErrClosed
			}
			if err != nil {
				u.refs--
				u.setState(upNone)
				e.removeUplinkLocked(u)
				e.mu.Unlock()
				last = err
				if (staleReject(err) || moving && busyReject(err)) && attempt < 15 {
					// The peer still holds a connection from this node on
					// our INI's number (an earlier process's, whose number
					// the kernel gave us again); the kernel has just sent
					// it a DREQ. Ask again shortly. So for a MOVE refused
					// BUSY_RETRY (see below).
					if err := staleWait(ctx, attempt); err != nil {
						return err
					}
					continue
				}
				return err
			}
			delete(e.replaced, key)
			u.dom = acc.DomainID
			e.learnDomainLocked(raddr, acc.DomainID)
			u.cur, u.inis = q, append(u.inis, q)
			u.setState(upUp)
			err = e.bindLocked(c, u, &acc)
			e.mu.Unlock()
			e.startINI(u, q)
			return err
		}
		if u.state != upUp {
			if err := e.awaitChange(ctx, c, u); err != nil {
				return err
			}
			// Waiting is not a failed attempt: with many dials on one
			// uplink that comes and goes, each state change would spend
			// one of every waiting dial's (ctx bounds the waits).
			attempt--
			continue
		}
		u.refs++
		q := u.cur
		req := e.req(c, wire.TypeVirtReq, peerTag)
		req.INIQPN, req.TGTQPNHint, req.DomainHint = q.num, q.tgt, u.dom
		if moving {
			c.moveReq(&req)
		} else if peerTag == 0 && !c.inbound && !c.twoExchanges {
			// A forward leg: announce the tag we will receive the reverse
			// leg on, so that the acceptor may put it in its ACCEPT.
			if c.earlyTag == 0 && c.recvLeg == nil {
				c.earlyTag = e.acc.ReserveTag()
				e.recv[c.earlyTag] = c
			}
			if c.earlyTag != 0 {
				req.Flags |= wire.FlagOneExchange
				req.PeerTag = c.earlyTag
			}
		}
		e.mu.Unlock()
		acc, err := e.virtLink(ctx, raddr, &req)
		if err == nil && !moving && acc.Flags&wire.AcceptReverse != 0 {
			// Register the reverse leg now, before our leg is bound:
			// the acceptor's recovery may have to move it meanwhile, and
			// a MOVE of a leg we do not know yet is refused BUSY_RETRY
			// until we do. Were we to wait for our own uplink's
			// recovery first, and that recovery for the acceptor's
			// dial to us in the same state, neither would ever move.
			e.takeReverse(c, &acc)
		}
		e.mu.Lock()
		// From here the peer holds the leg: any request that follows
		// moves it (one that did not would be refused as a leg it knows).
		moving = moving || err == nil
		// The uplink may have been rebuilt while we asked: the leg then
		// lives on the old TGT and must move to the new one.
		for err == nil && (u.cur != q || u.state != upUp) {
			if u.state == upNone {
				err = errUplinkGone
				break
			}
			if u.state != upUp {
				ch := u.changed
				e.mu.Unlock()
				select {
				case <-ch:
				case <-ctx.Done():
					err = ctx.Err()
				}
				e.mu.Lock()
				continue
			}
			q = u.cur
			req.Flags &^= wire.FlagOneExchange
			c.moveReq(&req)
			if req.Flags&wire.FlagReciprocal == 0 {
				req.PeerTag = 0
			}
			req.INIQPN, req.TGTQPNHint, req.DomainHint = q.num, q.tgt, u.dom
			e.mu.Unlock()
			acc, err = e.virtLink(ctx, raddr, &req)
			e.mu.Lock()
		}
		if err == nil {
			// The ACCEPT proves raddr's domain as a PHYS one does: the
			// acceptor refuses a hint that is not its domain, and
			// virtLink checked the echo. Learned, an acceptor's reverse
			// leg to raddr can ride its next ACCEPT (bindReverseLocked).
			e.learnDomainLocked(raddr, acc.DomainID)
			err = e.bindLocked(c, u, &acc)
			e.mu.Unlock()
			return err
		}
		u.refs--
		e.maybeTeardownLocked(u)
		last = err
		if errors.Is(err, errUplinkGone) {
			// Gone with nothing to move: make the next uplink with
			// this leg moving over to it (moving is set).
			e.mu.Unlock()
			continue
		}
		var rj *RejectError
		if errors.As(err, &rj) {
			switch rj.Reason {
			case RejectDomainMismatch:
				// Another domain on that node: use (or make) its uplink.
				if rj.domain != 0 && rj.domain != u.dom {
					e.learnDomainLocked(raddr, rj.domain)
					e.mu.Unlock()
					continue
				}
			case RejectBusyRetry:
				// A MOVE of the leg the peer accepted, which it holds on
				// maxPrev TGTs it left until its SRQ drains: asked again,
				// as a recovery asks (moveAgain). Taken as final, the dial
				// failed where the same leg bound would have moved
				// (TestDialMoveBusyRetryAsksAgain). A new leg's is a full
				// or closing acceptor's word: final.
				if moving && attempt < 15 {
					e.mu.Unlock()
					if err := staleWait(ctx, attempt); err != nil {
						return err
					}
					continue
				}
			case RejectTGTGone:
				// Our TGT there died (its last holder left): rebuild.
				// The REJECT comes from the process we dial, which need
				// not be honest, and the rebuild moves every leg on the
				// uplink: one naming another domain is refused as it
				// stands, and a dial rebuilds an uplink once, so a liar
				// costs a dial one rebuild per uplink, not one per round
				// trip until ctx ends (17 until u.refuted).
				if rj.domain != u.dom {
					break
				}
				again := slices.Contains(rebuilt, u)
				if again && u.cur != q {
					// A TGT u has left since we asked (another
					// recovery replaced it): no word on u's current
					// one, which may carry healthy legs. Refuted, u
					// stayed for their lives beside the uplink this
					// dial made, one more each time
					// (TestStaleTGTGoneDoesNotRefuteUplink). Ask again,
					// and not as a failed attempt: with a slow acceptor
					// and connections closing fast, each new TGT died
					// before the dial's request naming it was answered,
					// and a healthy dial failed after 16 such answers
					// (TestStaleTGTGoneSpendsNoAttempt; its deadline
					// bounds it, as it does a silent peer).
					e.mu.Unlock()
					attempt--
					continue
				}
				if again && (u.settling || u.state != upUp) {
					// u's recovery still moves legs onto q, or has
					// found it failed: its MOVEs, not this dial, learn
					// whether q's TGT died (its creator gone before the
					// others opened it), and the next round moves u's
					// healthy legs off it. Refuted, u stayed for their
					// lives beside the uplink this dial made
					// (TestTGTGoneWhileSettlingDoesNotRefuteUplink).
					// Ask again once u is past q, or settled on it.
					for u.cur == q && u.state != upNone && (u.settling || u.state != upUp) {
						if err := e.awaitChange(ctx, c, u); err != nil {
							return err
						}
						e.mu.Lock()
					}
					if u.cur != q {
						// Past q: a refusal about a TGT u has left, as
						// above, and no failed attempt: 16 recoveries
						// during one dial failed it
						// (TestTGTGoneWhileRecoveringSpendsNoAttempt).
						attempt--
					}
					e.mu.Unlock()
					continue
				}
				if again {
					// Refused again onto the TGT the rebuild made: not
					// a TGT that died, but a domain u does not have (or
					// a liar). Not rebuilt again (that moves every leg
					// on u): this dial, and later ones, make their own.
					u.refuted = true
					e.mu.Unlock()
					continue
				}
				e.failINILocked(u, q)
				e.mu.Unlock()
				// Not only the first uplink: one that another dial made
				// once this one had gone or was refuted may lose its TGT
				// too (its connections closed). Taken for a lie, each
				// such refusal spent an attempt, and with a slow acceptor
				// a healthy dial failed after 16 of them
				// (TestDialRebuildsEachUplinkOnce).
				rebuilt = append(rebuilt, u)
				attempt--
				continue
			}
		}
		e.mu.Unlock()
		return err
	}
	if last == nil {
		return errLegTries
	}
	return fmt.Errorf("%w (the last: %v)", errLegTries, last)
}

// awaitChange lets go of e.mu, which the caller holds, and waits for u's
// next change of state; it returns ctx's or c's error if either ends first.
func (e *Endpoint) awaitChange(ctx context.Context, c *Conn, u *uplink) error {
	ch := u.changed
	e.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-c.done:
		return c.errOr(ErrClosed)
	}
}

// bindLocked makes c's sending leg ride u, from the ACCEPT; the dial's
// reference on u becomes the leg's.
func (e *Endpoint) bindLocked(c *Conn, u *uplink, acc *wire.Accept) error {
	if !c.failed() && e.srqLiarLocked(c.raddr.Addr(), acc.Incarnation, acc.SRQN) {
		// An incarnation whose SRQ number named nothing at that node:
		// nothing posted (a frame would fail u's INI, which the other
		// legs share), no FIN either (it would name that number). A
		// dial's acceptor waits out its idle timeout for a first frame
		// that does not come, which only a liar or an ended process
		// pays; our reverse leg's dialer gets the ABORT (recvLegUp).
		u.refs--
		e.maybeTeardownLocked(u)
		c.failLocked(errSRQLiar)
		return c.err
	}
	if c.failed() || (c.peerInc != 0 && c.peerInc != acc.Incarnation) {
		if c.revFIN = c.inbound && e.finAcceptedLocked(c, u, acc); !c.revFIN {
			u.refs--
			e.maybeTeardownLocked(u)
		}
		if c.err == nil {
			c.failLocked(errIncarnation)
		}
		return c.err
	}
	c.up, c.holdsRef = u, true
	c.peerTag, c.peerSRQN, c.peerInc = acc.AcceptorTag, acc.SRQN, acc.Incarnation
	c.sendWindow, c.sendMax = uint32(acc.Credits), int(acc.MaxMessage)
	c.sendUp, c.lastSent = true, time.Now()
	u.legs[c] = struct{}{}
	c.checkReadyLocked()
	return nil
}

// finAcceptedLocked ends the reverse leg that acc accepted for c, which
// failed while its request was under way (bindLocked): the dialer took the
// leg, and its Dial returns the connection, which heard nothing of us until
// its idle timeout (TestReciprocalAnsweredToFailedHalf). One FIN, posted on
// u's INI; not posted (a full send queue, the uplink recovering), or
// flushed (its INI failed), an ABORT goes instead, which revFIN held back
// (abortTakenLocked). It
// reports whether it took over the dial's reference on u, let go of once
// the FIN has completed: let go of first, the last one tore u down before
// the FIN went, and the DREQ went to the TGT's maker, which need not be the
// dialer (TestReciprocalAnsweredToFailedHalfLastLeg).
func (e *Endpoint) finAcceptedLocked(c *Conn, u *uplink, acc *wire.Accept) bool {
	q := u.cur
	if q == nil || u.state != upUp {
		return false
	}
	b := make([]byte, 1+wire.FinLen)
	b[0] = kindFIN
	f := wire.FIN{Tag: acc.AcceptorTag, SenderTag: c.sendTag}
	if _, err := f.Encode(b[1:]); err != nil {
		return false
	}
	q.nextWR++
	wr := []kernel.SendWR{{WRID: q.nextWR, RemoteSRQN: acc.SRQN, Imm: acc.AcceptorTag, Payload: b}}
	// A waiter, though nothing waits for it: posted, it holds a slot of
	// the send queue until its completion is polled, and a post that
	// finds the queue full and no waiter but its own takes it for one
	// nothing posted holds (postData, post).
	ch := make(chan verbs.WCStatus, 1)
	q.waiters[wr[0].WRID] = waiter{c: c, ch: ch}
	peer := c.recvLeg.PeerTag
	if !e.spawn(func() {
		e.mu.Lock()
		up := u.cur == q && u.state == upUp
		e.mu.Unlock()
		posted := up && e.k.PostSend(q.qp, wr) == nil
		if f := e.testFINPosted.Load(); f != nil {
			(*f)()
		}
		went := posted
		if posted {
			// The reference goes once the FIN has completed (within a
			// handshake timeout, as a Close's FIN): let go of at the
			// post, the last one tore the link down with the FIN still
			// queued behind a stalled receiver, and the INI went with
			// it (TestFailedHalfFINBehindStallKeepsItsLink).
			t := time.NewTimer(e.cfg.HandshakeTimeout)
			select {
			case st := <-ch:
				// Flushed (its INI failed), it did not go either
				// (TestFailedHalfFINFlushedAborts).
				went = st == verbs.WCSuccess
			case <-t.C:
			case <-e.ctx.Done():
			}
			t.Stop()
		}
		e.mu.Lock()
		if !posted {
			delete(q.waiters, wr[0].WRID)
		}
		u.refs--
		e.maybeTeardownLocked(u)
		e.mu.Unlock()
		if !went {
			// No FIN went, and revFIN held the ABORT back: it tells
			// the dialer now (TestFailedHalfFINNotPostedAborts).
			e.abortReverse(c, peer)
		}
	}) {
		delete(q.waiters, wr[0].WRID)
		return false
	}
	return true
}

// physLink makes an INI and connects it with an XRC-typed CM exchange:
// PHYS_REQ, CONNECT_RESPONSE with the TGT number and the ACCEPT, INI to RTS,
// RTU.
func (e *Endpoint) physLink(ctx context.Context, raddr netip.AddrPort, req *wire.Req) (*iniQP, wire.Accept, error) {
	k := e.k
	var acc wire.Accept
	// Counted from before its CreateINI (the kernel holds it as that call
	// returns) until it joins an uplink (the caller) or goes.
	e.mu.Lock()
	e.iniSetup++
	e.mu.Unlock()
	qp, num, err := k.CreateINI()
	if err != nil {
		e.mu.Lock()
		e.iniSetup--
		e.mu.Unlock()
		return nil, acc, err
	}
	destroyQP := func() {
		k.DestroyQP(qp)
		e.mu.Lock()
		e.iniSetup-- // counted until destroyed
		e.mu.Unlock()
	}
	req.INIQPN = num
	b := make([]byte, wire.BudgetREQ)
	n, err := req.Encode(b)
	if err != nil {
		destroyQP()
		return nil, acc, err
	}
	id, err := k.Connect(ctx, raddr, kernel.ExchangeXRC, num, b[:n])
	if err != nil {
		destroyQP()
		return nil, acc, err
	}
	fail := func(err error) (*iniQP, wire.Accept, error) {
		k.DestroyID(id)
		destroyQP()
		return nil, acc, err
	}
	ev, err := k.Event(ctx, id)
	if err != nil {
		return fail(err)
	}
	switch ev.Type {
	case kernel.EventConnectResponse:
	case kernel.EventRejected, kernel.EventUnreachable: // refused, or no answer
		return fail(rejectErr(raddr, ev))
	default:
		return fail(&OpError{"connect", raddr.String(), errors.New("unexpected " + ev.Type.String())})
	}
	if err := wire.DecodeAccept(ev.PrivateData, &acc); err != nil || acc.TagEcho != req.ConnTag || acc.TGTQPN != ev.QPNum ||
		acc.Flags != 0 {
		k.Reject(id, nil)
		return fail(&OpError{"connect", raddr.String(), errBadAccept})
	}
	if err := k.TransitionQP(qp, verbs.QPStateRTS, id); err != nil {
		err = e.afterResponseErr(ctx, raddr, id, err)
		k.Reject(id, nil)
		return fail(err)
	}
	if err := k.Establish(id); err != nil {
		return fail(e.afterResponseErr(ctx, raddr, id, err))
	}
	return &iniQP{qp: qp, num: num, aid: id, tgt: acc.TGTQPN, waiters: map[uint64]waiter{}, room: make(chan struct{})}, acc, nil
}

// afterResponseErr names the failure (err) of our INI's move to RTS or of
// the RTU after the acceptor's CONNECT_RESPONSE. The CM refuses both, with
// a bare EINVAL, once the acceptor's REJ has ended the exchange: its
// process died after it accepted (its kernel rejects for it) or it gave up
// on us. That REJ, read from id, makes it ErrPeerGone, as the acceptor's
// death is at any later step.
func (e *Endpoint) afterResponseErr(ctx context.Context, raddr netip.AddrPort, id kernel.ID, err error) error {
	ctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond) // the REJ's event follows its state change
	defer cancel()
	if ev, evErr := e.k.Event(ctx, id); evErr == nil && ev.Type == kernel.EventRejected {
		return fmt.Errorf("%w: it ended the exchange after its ACCEPT: %w", ErrPeerGone, rejectErr(raddr, ev))
	}
	return err
}

// virtLink asks for a leg over an existing uplink with a SIDR exchange.
func (e *Endpoint) virtLink(ctx context.Context, raddr netip.AddrPort, req *wire.Req) (wire.Accept, error) {
	var acc wire.Accept
	b := make([]byte, wire.BudgetSIDRREQ)
	n, err := req.Encode(b)
	if err != nil {
		return acc, err
	}
	id, err := e.k.Connect(ctx, raddr, kernel.ExchangeSIDR, 0, b[:n])
	if err != nil {
		return acc, err // no VIRT_REQ went
	}
	e.virtReqs.Add(1)
	defer e.destroyLater(id) // a virtual link keeps no CM state
	ev, err := e.k.Event(ctx, id)
	if err != nil {
		return acc, err
	}
	switch ev.Type {
	case kernel.EventEstablished:
	case kernel.EventUnreachable:
		return acc, rejectErr(raddr, ev)
	default:
		return acc, &OpError{"connect", raddr.String(), errors.New("unexpected " + ev.Type.String())}
	}
	if err := wire.DecodeAccept(ev.PrivateData, &acc); err != nil || acc.TagEcho != req.ConnTag ||
		acc.TGTQPN != req.TGTQPNHint || ev.QPNum != acc.TGTQPN || acc.DomainID != req.DomainHint ||
		(acc.Flags&wire.AcceptReverse != 0 && req.Flags&wire.FlagOneExchange == 0) {
		return acc, &OpError{"connect", raddr.String(), errBadAccept}
	}
	return acc, nil
}

// destroyLater destroys the id of a finished SIDR exchange in the
// background: the dial need not wait for the kernel (0.2-0.3 ms of a 4-6 ms
// logical connection on rxe). Close waits for it; once Close waits, the id
// goes at once instead.
func (e *Endpoint) destroyLater(id kernel.ID) {
	e.sidrGoing.Add(1)
	destroy := func() {
		e.k.DestroyID(id)
		e.sidrGoing.Add(-1)
	}
	if !e.spawn(destroy) {
		destroy()
	}
}

// staleWait waits before a request is sent again after the CM's
// stale-connection reject (see openLeg) or, for a recovery's MOVE, a
// BUSY_RETRY (see moveAgain): longer at each try.
func staleWait(ctx context.Context, try int) error {
	select {
	case <-time.After(time.Duration(try+1) * 10 * time.Millisecond):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// moveAgain reports whether a recovery's MOVE is worth asking again: the
// CM's stale-connection verdict on a reused INI number (as in openLeg), or
// BUSY_RETRY from a receiver that may register the leg in a moment (a
// reverse leg whose ACCEPT it has not read yet; see Endpoint.onRequest).
func moveAgain(err error) bool {
	return staleReject(err) || busyReject(err)
}

// busyReject reports whether err is a peer's REJECT(BUSY_RETRY).
func busyReject(err error) bool {
	var rj *RejectError
	return errors.As(err, &rj) && rj.Reason == RejectBusyRetry
}

// staleReject reports whether err is the CM's stale-connection reject
// (REJ reason 10) of a PHYS_REQ.
func staleReject(err error) bool {
	var rj *RejectError
	return errors.As(err, &rj) && rj.Reason == RejectCM && rj.Status == kernel.RejStaleConn
}

// rejectErr reads a REJECTED or UNREACHABLE event.
func rejectErr(raddr netip.AddrPort, ev kernel.Event) error {
	re := &RejectError{Addr: raddr.String(), Status: ev.Status, Reason: RejectCM, SIDR: ev.Type == kernel.EventUnreachable}
	var r wire.Reject
	if wire.DecodeReject(ev.PrivateData, &r) == nil {
		re.Reason, re.Detail, re.domain = RejectReason(r.Reason), r.Detail, r.DomainID
	} else if (ev.Type == kernel.EventRejected && ev.Status == kernel.RejInvalidServiceID) ||
		(ev.Type == kernel.EventUnreachable && ev.Status == kernel.SIDRNoListener) {
		re.Reason = RejectNoListener
	}
	return re
}

// startINI runs the completion dispatcher and the CM watcher of an INI.
func (e *Endpoint) startINI(u *uplink, q *iniQP) {
	e.spawn(func() { e.pollSend(u, q) })
	e.spawn(func() { e.watchActive(u, q) })
}

// pollSend hands each send completion to its waiter. An error moves the
// uplink to RECOVERING; a send to an SRQ that is gone (the receiver's
// endpoint closed or died) also ends that connection, or only its sending
// leg while its receiving leg is up (endSendingLegLocked).
func (e *Endpoint) pollSend(u *uplink, q *iniQP) {
	var wcs [32]kernel.SendCompletion
	for {
		n, err := e.k.PollSend(e.ctx, q.qp, wcs[:])
		if err != nil { // destroyed, the endpoint closing, or the poll failed
			e.mu.Lock()
			// A failed poll leaves nothing to hear q's completions: q
			// is done for, as after a failed completion (it does
			// nothing where q is no longer u's INI, or not up). A
			// recovery's new INI may fail before it is u's: broken,
			// that recovery starts the next as it ends.
			if e.ctx.Err() == nil {
				q.pollErr, q.broken = err, true
			}
			e.failINILocked(u, q)
			ws := q.waiters
			q.waiters = map[uint64]waiter{}
			q.polls++
			q.roomLocked()
			e.mu.Unlock()
			for _, w := range ws {
				if w.ch != nil {
					w.ch <- verbs.WCWRFlushErr
				}
			}
			return
		}
		for _, wc := range wcs[:n] {
			e.mu.Lock()
			q.polls++
			q.roomLocked() // polled: a slot is free
			if u.cur == q {
				u.pollFails = 0 // its poll works
			}
			w, ok := q.waiters[wc.WRID]
			delete(q.waiters, wc.WRID)
			if ok && wc.Status == verbs.WCSuccess && !w.probe {
				if w.c.firstDue {
					// Its acceptor, silent until our first frame,
					// is due to show signs of life from now.
					w.c.lastSeen = time.Now()
				}
				w.c.firstDue = false // the receiver has had a frame of ours
			}
			if ok && wc.Status == verbs.WCSuccess {
				w.c.reached = true
			}
			if ok && w.data && wc.Status == verbs.WCSuccess {
				w.c.completedLocked(w.seq)
			}
			if wc.Status != verbs.WCSuccess {
				// A remote invalid request ends the leg that sent it
				// (its receiver's SRQ is gone, or never was): the
				// INI's failure is that leg's, no try of the frames
				// flushed with it. Counted, a process whose ACCEPTs
				// name no SRQ of its node used up a healthy
				// connection's tries, one per leg of ours to it
				// (TestBogusSRQNLiarKeepsHealthyConn).
				remInv := wc.Status == verbs.WCRemInvReqErr && ok
				if wc.Status != verbs.WCWRFlushErr && !remInv {
					q.erred = true
				}
				if remInv {
					// On a leg never reached before, its peer's SRQ
					// number named nothing: that incarnation's later
					// legs are refused, each of which would fail the INI
					// again (TestBogusSRQNLiarRefusedAfterFirstFrame).
					e.srqLiarFirstFrameLocked(w.c)
				}
				if remInv && !e.endSendingLegLocked(w.c, errSRQGone) {
					w.c.failLocked(errSRQGone)
				}
				e.failINILocked(u, q)
			}
			e.mu.Unlock()
			if ok && w.ch != nil {
				w.ch <- wc.Status
			}
		}
	}
}

// endSendingLegLocked ends only c's sending leg, with err, when its
// receiver's endpoint is gone but c's receiving leg is up: what the receiver
// sent before it closed may still sit in our SRQ, its FIN among it (it closed
// the connection, then the endpoint, before our failed post or MOVE told us).
// The FIN ends the connection, or the receive loop fails it with err at its
// next poll that finds the SRQ empty (endGoneSenders; the janitor too, as
// after a DREQ). The receiver's end shows as a refused MOVE (NO_LISTENER)
// when the TGT died with it, and as a post completing with "remote invalid
// request" when another process of its node still holds the TGT. It reports
// false, doing nothing, when c has no receiving leg up.
func (e *Endpoint) endSendingLegLocked(c *Conn, err error) bool {
	if c.recvLeg == nil || !c.recvUp || c.recvReleased {
		return false
	}
	if c.sendGone != nil {
		return true
	}
	c.sendGone = err
	c.dropSendLocked()
	c.wakeSendersLocked()
	c.goneAt, c.goneDrains = time.Now(), e.polls.Load()
	e.goneSenders.Add(1)
	e.kickPoll() // the next polls have a deadline: an idle SRQ drains too
	return true
}

// failINILocked starts the recovery of u if q is its current INI.
func (e *Endpoint) failINILocked(u *uplink, q *iniQP) {
	if u.cur == q && u.state == upRecovering {
		q.broken = true // recovering onto it: recover starts again
		return
	}
	// Nothing is rebuilt while the endpoint closes, but for a leg a round
	// left on an old TGT (uplink.kept): its FIN goes once it has moved.
	if u.cur != q || u.state != upUp || e.closed && (len(u.kept) == 0 || e.ctx.Err() != nil) {
		return
	}
	if u.settling {
		// The recovery that made q still moves legs onto it: nothing
		// posts from now on, and that recovery starts the next one
		// once its MOVEs are answered (two at once would move the same
		// legs twice).
		q.broken = true
		u.setState(upRecovering)
		return
	}
	u.setState(upRecovering)
	if q.pollErr != nil {
		if u.pollFails++; u.pollFails > 1 {
			// The INI the last recovery made failed its poll too,
			// before it took a completion: recovering again would
			// loop for ever while Send waits. The legs fail, and
			// this recovery, with no leg left to move, ends u.
			err := fmt.Errorf("%w: %w", errSendPoll, q.pollErr)
			for c := range u.legs {
				c.failLocked(err)
			}
		}
	}
	if e.spawn(func() { e.recover(u, q) }) {
		// Counted once it runs: Close may stop the spawns after the
		// guard above (its cancel and stop take no e.mu).
		e.recoveries.Add(1)
	}
}

// watchActive follows the physical CM connection of an INI: a DREQ from
// the TGT side (a stale-connection verdict) fails the INI; TIMEWAIT_EXIT
// after our disconnect ends it, and only then is the INI destroyed.
func (e *Endpoint) watchActive(u *uplink, q *iniQP) {
	for {
		ev, err := e.k.Event(e.ctx, q.aid)
		if err != nil {
			return
		}
		switch ev.Type {
		case kernel.EventDisconnected:
			e.mu.Lock()
			e.failINILocked(u, q)
			e.mu.Unlock()
			e.k.Disconnect(q.aid) // the DREP, if this was the peer's DREQ
		case kernel.EventTimewaitExit:
			e.endINI(u, q)
			return
		}
	}
}

// endINI destroys q, an INI of u whose physical link ended (its
// TIMEWAIT_EXIT), or whose DREQ the kernel refused (disconnectINI); once.
func (e *Endpoint) endINI(u *uplink, q *iniQP) {
	e.mu.Lock()
	ending := q.ending
	q.ending = true
	e.mu.Unlock()
	if ending {
		return
	}
	// Counted until the INI itself goes (Stats.Uplinks).
	e.k.DestroyID(q.aid)
	e.k.DestroyQP(q.qp)
	e.mu.Lock()
	u.inis = slices.DeleteFunc(u.inis, func(x *iniQP) bool { return x == q })
	if u.state == upNone && len(u.inis) == 0 {
		e.removeUplinkLocked(u)
	}
	e.mu.Unlock()
}

// disconnectINI sends the DREQ of q's physical link: watchActive destroys
// q at its TIMEWAIT_EXIT. A DREQ the kernel refuses (rdma_disconnect's
// error) brings none, and q and its CM id were held until Close: they are
// destroyed now (destroying the id sends what its state calls for). The
// caller may hold e.mu.
func (e *Endpoint) disconnectINI(u *uplink, q *iniQP) {
	if e.k.Disconnect(q.aid) != nil {
		e.spawn(func() { e.endINI(u, q) })
	}
}

// maybeTeardownLocked ends an UP uplink nobody uses: disconnect the
// physical CM connection; watchActive destroys the INI after TIMEWAIT_EXIT.
func (e *Endpoint) maybeTeardownLocked(u *uplink) {
	if u.refs > 0 || u.state != upUp {
		return
	}
	q := u.cur
	u.cur = nil
	u.setState(upNone)
	e.disconnectINI(u, q)
	for _, o := range u.kept {
		e.disconnectINI(u, o)
	}
	u.kept = nil
}

// recover rebuilds a failed uplink: a new INI is connected with a PHYS_REQ
// flagged REPLACES_TGT|MOVE to the first live receiver, every other leg
// moves to the new TGT with a VIRT_REQ flagged MOVE, and once every MOVE is
// answered the old physical link is disconnected (unless a leg left for the
// next round is still on its TGT: see uplink.kept): its DREQ tells the TGT's
// creator that the legs still on the old TGT are gone. Sent first, it could
// reach a receiver before that receiver's MOVE and end a live leg. Legs
// whose receiver refuses or is gone, or does not answer within its MOVE's
// deadline, fail. Sends and dials wait until the new INI is up; the uplink
// is UP from then on (once the PHYS_REQ's leg has sent again what had not
// completed), and each other leg stays unmoved, posting nothing, until its
// own MOVE is answered and it has sent its kept messages again. A FIN that
// ends a leg waits until every MOVE is answered (Conn.finHeldLocked): the
// legs moved first may be all that holds the new TGT.
func (e *Endpoint) recover(u *uplink, old *iniQP) {
	// Nothing may reach the old TGT once the MOVEs begin: a receiver takes
	// a leg's messages through it only until its SRQ drains after the
	// MOVE and drops what comes later, while we would take the send's
	// success for delivery. An INI that failed is in ERR already; one given
	// up for a TGT_GONE, a DREQ or a send queue that stays full is not:
	// there its held sends are flushed, and go again after the MOVE.
	e.k.TransitionQP(old.qp, verbs.QPStateErr, 0)
	e.mu.Lock()
	legs := make([]*Conn, 0, len(u.legs))
	finPosted := map[*Conn]bool{}
	for c := range u.legs {
		legs = append(legs, c)
		if c.finPosted {
			finPosted[c] = true
		}
	}
	dom := u.dom
	e.mu.Unlock()
	// In tag order, but a leg whose full FIN went to PostSend last: its
	// receiver may have the FIN in its SRQ, not taken yet, and let the leg
	// go right after taking its MOVE. Moved first, with the PHYS_REQ, the
	// leg was then all that held the new TGT, which died with it, and the
	// other legs' VIRT_REQs were refused TGT_GONE: a second round for
	// nothing (TestPostedFINInSRQCostsNoSecondRecovery).
	slices.SortFunc(legs, func(a, b *Conn) int {
		if finPosted[a] != finPosted[b] {
			if finPosted[a] {
				return 1
			}
			return -1
		}
		return cmp.Compare(a.sendTag, b.sendTag)
	})
	var q *iniQP
	var moved []*Conn // the legs now on q: only theirs go again on it
	// Each MOVE has its own deadline, under half the idle timeout: the
	// receivers hear nothing from us while their legs move, and one
	// receiver that does not answer must not spend the others' time.
	budget := min(e.cfg.HandshakeTimeout, e.cfg.IdleTimeout/2)
	live := func(c *Conn) bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		return !c.failed() && !c.sendDone
	}
	// A receiver that let a PHYS_REQ time out (its deadline or the CM's:
	// unansweredErr) is not asked again for its
	// other legs' (each would cost another budget while the others' idle
	// timers run): they wait for the VIRT_REQs. Once the new INI is up, the
	// uplink is UP and the other legs move at once, in parallel, each
	// resuming its traffic when its own MOVE is answered: a stalled
	// receiver's VIRT_REQs hold up only its own legs. Still open: the
	// PHYS_REQs go one after another, so two stalled receivers whose legs
	// sort first cost two budgets, an idle timeout, in which the node's
	// healthy receivers hear nothing and may give up on us.
	silent := map[netip.AddrPort]bool{}
	var later []*Conn
	rest := legs
	for len(rest) > 0 && q == nil {
		c := rest[0]
		rest = rest[1:]
		if !live(c) {
			continue
		}
		if silent[c.raddr] {
			later = append(later, c)
			continue
		}
		req := e.req(c, wire.TypePhysReq, 0)
		req.Flags = wire.FlagReplacesTGT
		req.TGTQPNHint = old.tgt
		c.moveReq(&req)
		ctx, cancel := context.WithTimeout(e.ctx, budget)
		nq, acc, err := e.physLink(ctx, c.raddr, &req)
		for try := 0; moveAgain(err) && try < 8 && staleWait(ctx, try) == nil; try++ {
			nq, acc, err = e.physLink(ctx, c.raddr, &req)
		}
		cancel()
		if err == nil {
			q = nq
			e.mu.Lock()
			u.inis = append(u.inis, q)
			e.iniSetup--
			e.mu.Unlock()
		} else if unansweredErr(err) {
			silent[c.raddr] = true
		}
		e.moveLost(err)
		if e.moveDone(u, q, c, dom, acc, err, true, &moved) {
			e.startINI(u, q)
		}
	}
	if q == nil {
		for _, c := range later { // no INI to move them to
			e.moveDone(u, nil, c, dom, wire.Accept{}, errNoAnswer, false, &moved)
		}
		e.mu.Lock()
		olds := append(u.kept, old)
		u.kept = nil
		e.mu.Unlock()
		for _, o := range olds {
			e.disconnectINI(u, o)
		}
		e.mu.Lock()
		defer e.mu.Unlock()
		// Nobody left to move to: the uplink is gone. The next dial there
		// makes a new one, flagged REPLACES_TGT.
		key := upKey{u.node.WithZone(""), dom}
		if _, ok := e.replaced[key]; !ok && len(e.replaced) >= maxAddrDoms {
			// Bounded as the addresses' domains are: a node that never
			// comes back kept its entry for the endpoint's life. The flag
			// only informs the acceptor, so one forgotten costs nothing.
			for k := range e.replaced {
				delete(e.replaced, k)
				break
			}
		}
		e.replaced[key] = old.tgt
		u.cur = nil
		u.setState(upNone)
		if len(u.inis) == 0 {
			e.removeUplinkLocked(u)
		}
		return
	}
	rest = append(later, rest...)
	// Every other live leg is unmoved until its MOVE is answered: its
	// receiver takes its messages through the old TGT only, and drops what
	// comes through q's, so nothing of it may post on q before (a message
	// that completed there would be lost), and once moved it first sends
	// again, in order, what had not completed.
	e.mu.Lock()
	var pending []*Conn
	for _, c := range rest {
		if !c.failed() && !c.sendDone {
			c.unmoved = true
			pending = append(pending, c)
		}
	}
	u.cur = q
	// Settling until the end, VIRT legs or none: a failure of q before
	// then is this recovery's to answer (q.broken), not a second one's
	// that this one's last setState(upUp) would run over.
	u.settling = true
	e.mu.Unlock()
	type result struct {
		c   *Conn
		acc wire.Accept
		err error
	}
	results := make(chan result, len(pending))
	sem := make(chan struct{}, 16) // SIDR exchanges in flight
	for _, c := range pending {
		go func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			req := e.req(c, wire.TypeVirtReq, 0)
			c.moveReq(&req)
			req.INIQPN, req.TGTQPNHint, req.DomainHint = q.num, q.tgt, dom
			ctx, cancel := context.WithTimeout(e.ctx, budget)
			defer cancel()
			acc, err := e.virtLink(ctx, c.raddr, &req)
			for try := 0; moveAgain(err) && try < 8 && staleWait(ctx, try) == nil; try++ {
				acc, err = e.virtLink(ctx, c.raddr, &req)
			}
			results <- result{c, acc, err}
		}()
	}
	// Still RECOVERING, so no Send posts: the PHYS_REQ's leg first sends
	// again, on the new INI and in order, what has not completed. So does
	// each other leg once moved (below), still unmoved meanwhile. A leg
	// left for the next round does not: its receiver does not take
	// messages through q's TGT yet, and one that completed here would be
	// lost. Also while the endpoint closes: its FINs wait for the uplink
	// to be up. The resends wait for their turns with the endpoint's
	// context, not a deadline: a resend given up would lose the messages
	// without a word.
	for _, c := range moved {
		c.resend(e.ctx, u, q)
	}
	e.mu.Lock()
	if !q.broken {
		// Else it failed during the resends, or its TGT died: the next
		// round starts once the MOVEs under way are answered.
		u.setState(upUp)
	}
	e.mu.Unlock()
	for range pending {
		r := <-results
		e.moveLost(r.err)
		var mv []*Conn
		e.moveDone(u, q, r.c, dom, r.acc, r.err, false, &mv)
		for _, c := range mv {
			c.resend(e.ctx, u, q)
		}
		e.mu.Lock()
		// A leg refused TGT_GONE stays unmoved: it waits for the next
		// round (q is broken).
		if len(mv) > 0 || r.c.failed() || r.c.sendDone {
			r.c.unmoved = false
			u.pokeLocked()
		}
		e.mu.Unlock()
	}
	e.mu.Lock()
	var olds []*iniQP
	if slices.ContainsFunc(pending, func(c *Conn) bool { return c.unmoved && !c.failed() && !c.sendDone }) {
		u.kept = append(u.kept, old) // a leg left for the next round is still on its TGT
	} else {
		olds = append(u.kept, old)
		u.kept = nil
	}
	e.mu.Unlock()
	for _, o := range olds {
		e.disconnectINI(u, o)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	u.settling = false
	for _, c := range pending {
		c.unmoved = false
	}
	if u.cur != q {
		return // every leg went meanwhile: torn down (maybeTeardownLocked)
	}
	u.setState(upUp)
	if q.broken {
		e.failINILocked(u, q) // it failed meanwhile, or its TGT died: again
		return
	}
	u.gone = 0
	e.maybeTeardownLocked(u)
}

// moveLost ends the endpoint where a MOVE's exchange failed (err) with the
// device's removal: the CM sends DEVICE_REMOVAL to every id on the device,
// and a recovery waiting for a MOVE's answer may read it before the
// listeners do. As in watchPassive, it is the endpoint's end (die: every
// connection ErrDeviceRemoved), not the receiver's refusal: moveDone would
// fail the leg "peer gone" (its %v drops ErrDeviceRemoved from the chain),
// a verdict the listeners' die a moment later kept
// (TestDeviceRemovalDuringRecoveryMove).
func (e *Endpoint) moveLost(err error) {
	if errors.Is(err, ErrDeviceRemoved) && e.ctx.Err() == nil {
		e.die(err)
	}
}

// errNoAnswer fails a leg whose receiver let an earlier leg's PHYS_REQ time
// out in a recovery that made no new INI.
var errNoAnswer = errors.New("its receiver did not answer an earlier MOVE in time")

// unansweredErr reports whether a MOVE failed with err for its receiver's
// silence: its deadline, or the CM's own timeout (-ETIMEDOUT), the same
// silence found before the deadline, or an earlier leg's (errNoAnswer).
func unansweredErr(err error) bool {
	var rj *RejectError
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, errNoAnswer) || errors.As(err, &rj) && rj.Timeout()
}

// moveDone books the answer to leg c's MOVE onto q (physical: the PHYS_REQ
// that made q, or failed to) and reports whether q was made by it.
func (e *Endpoint) moveDone(u *uplink, q *iniQP, c *Conn, dom uint64, acc wire.Accept, err error, physical bool, moved *[]*Conn) (fresh bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	fresh = physical && err == nil
	if err == nil && (acc.AcceptorTag != c.peerTag || acc.Incarnation != c.peerInc || acc.DomainID != dom) {
		err = errIncarnation
	}
	var rj *RejectError
	// A round counted already (q.goneCounted) leaves each of its legs
	// refused so: the limit is the rounds', not the order of the answers.
	if !physical && errors.As(err, &rj) && rj.Reason == RejectTGTGone && (q.goneCounted || u.gone < maxGoneRounds) {
		// The new TGT is gone already: the legs moved onto it all
		// closed (the first one's FIN can come right after its MOVE).
		// This leg waits for the next round, which makes another
		// (q.broken starts it); a peer that answers so round after round
		// fails it. Counted once a round, also where q had failed
		// already (its TGT side's DREQ): else such rounds went on for ever.
		if !q.goneCounted {
			q.goneCounted = true
			u.gone++
		}
		q.broken = true
		return fresh
	}
	switch {
	case err != nil && c.finOut:
		// Our FIN went out, and a receiver that took it let the leg go:
		// the refusal answers the FIN. Only the sending leg ends; the
		// receiving leg waits for the peer's FIN as at any close (the
		// peer may still need it to complete: its reverse leg). A
		// receiver whose endpoint is gone (NO_LISTENER) may have died
		// before it took our FIN: as for a Send, its FIN in our SRQ or
		// the receive loop decides (endSendingLegLocked).
		if !(errors.As(err, &rj) && rj.Reason == RejectNoListener && e.endSendingLegLocked(c, fmt.Errorf("%w: leg not moved: %v", ErrPeerGone, err))) {
			c.dropSendLocked()
		}
		c.maybeFinishLocked()
	case err != nil && errors.As(err, &rj) && rj.Status >= 0 && e.endSendingLegLocked(c, fmt.Errorf("%w: leg not moved: %v", ErrPeerGone, err)):
		// Refused: the receiver's endpoint is gone (NO_LISTENER, with the
		// TGT our old INI reached), or a process that took its port since
		// does not know the leg (found by a review): only the sending leg
		// ended. (A receiver that does not answer fails the connection.)
	case err != nil:
		gone := ErrPeerGone
		if unansweredErr(err) {
			gone = errUnanswered // its silence, not its death (Err)
		}
		c.failLocked(fmt.Errorf("%w: leg not moved: %v", gone, err))
	default:
		e.moved.Add(1)
		*moved = append(*moved, c)
	}
	return fresh
}
