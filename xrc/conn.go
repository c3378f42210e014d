package xrc

import (
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"net/netip"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/internal/ring"
	"github.com/goxrc/goxrc/verbs"
	"github.com/goxrc/goxrc/xrc/internal/wire"
)

// Conn is a logical connection: two one-way legs, ours sending over our
// uplink to the peer's node into the peer's SRQ, the peer's sending over its
// uplink into ours. Messages keep their boundaries. Every message carries
// the receiver's tag; a receiver drops messages whose tag names no live
// connection of its own. Only an Endpoint's Dial and Accept make a Conn: a
// nil or zero one is a closed one, as in package cm: its calls return
// ErrClosed itself (not an *OpError), Close returns nil, and its accessors
// give their zero values.
type Conn struct {
	e     *Endpoint
	raddr netip.AddrPort // the peer endpoint's listening address

	// All below under e.mu.
	inbound bool

	// sending leg
	sendTag  uint32 // our REQ's ConnTag (FIN's SenderTag)
	up       *uplink
	holdsRef bool
	peerTag  uint32 // the receiver's tag: the Imm of every send
	peerSRQN uint32
	peerInc  uint64
	sendUp   bool
	sendDone bool // FIN sent or leg dropped
	finOut   bool // our FIN (not HALF) was posted: see recover
	// finPosted: that FIN went to PostSend (on some INI): a receiver may
	// have it, and let the leg go. Only a recovery's resend puts a frame
	// before its copy, one that proves the new INI's poll (see resend).
	finPosted bool
	// revFIN: an inbound half that failed while its reverse leg's request
	// was under way, and whose dialer took the leg: a FIN on it tells the
	// dialer (Endpoint.finAcceptedLocked), no ABORT.
	revFIN bool
	// internalPosts counts internal frames (credits, keepalives) between
	// post's check and the end of their PostSend: our full FIN waits for
	// them (postsIdle, closed when it falls to 0), or one could go after
	// it, to a receiver that let the leg go at the FIN.
	internalPosts int
	postsIdle     chan struct{}
	// firstDue: a dial, whose acceptor's half completes at our first
	// frame (Endpoint.consumeLocked), none of ours known to have arrived
	// yet (a completion says so): a recovery sends a keepalive first
	// (see resend). Not for an abandoned attempt, whose FIN is to be the
	// first.
	firstDue bool
	// reached: a frame of ours on the sending leg completed, so peerSRQN
	// named an SRQ of the peer's node once (see srqLiarFirstFrameLocked).
	reached bool
	// firstHeld: a dial whose reverse leg comes by the acceptor's
	// reciprocal request, not up yet: our first frame waits until it is
	// (Endpoint.dialUp), and our keepalives go as credit frames, which
	// show the leg alive but are no first frame (see post).
	firstHeld bool
	// keepalives counts the keepalives posted on our leg (not firstHeld's
	// credit frames), less those whose post failed: any may have been
	// the acceptor's first frame (see Endpoint.abortFirst).
	keepalives int
	// abandoned: Endpoint.abortDial gave the dial up and ends it with a
	// FIN, which the acceptor's half takes for an abandonment
	// only as the first frame: no keepalive (the janitor's, waiting for
	// room) goes before it, and no reverse leg is taken for it (onRequest).
	abandoned bool
	// unmoved: the uplink is UP on a rebuilt INI, but the recovery's MOVE
	// of this leg is not answered yet (its receiver takes our messages
	// through the old TGT only): nothing posts until it is (see recover).
	unmoved  bool
	lastSent time.Time
	// lastQ, lastWR: the newest frame registered on our leg (a waiter on
	// lastQ until its completion). While it waits, a keepalive would be
	// queued behind it and show nothing it does not: the janitor sends
	// none (under RNR waits, keepalives after keepalive filled the INI's
	// send queue ahead of data).
	lastQ  *iniQP
	lastWR uint64
	// moves numbers this leg's MOVEs (wire.Req.Move): each is one past
	// the last, so that the receiver refuses a late or replayed one.
	// Atomic: recoveries build their requests without e.mu.
	moves atomic.Uint32

	// Flow control (xrc-protocol.md, "Flow control"). Counts wrap: only
	// their differences mean anything.
	sendWindow uint32              // the receiver's window, from its ACCEPT (or REQ)
	sendMax    int                 // the largest message the receiver takes, from the same
	sent       uint32              // data messages that took a credit
	sendSeq    uint32              // the next data message's sequence number
	out        ring.Ring[outFrame] // data messages whose completion has not come, in order (made with the first, replaySpan long)
	turn       chan struct{}       // held (one token) by the goroutine posting on the connection
	spanWait   bool                // a sender waits in spanFullLocked
	creditWait bool                // a sender waits for acked to grow
	acked      uint32              // of those, taken by the receiver's Recv (its credit frames)
	credited   chan struct{}       // closed and replaced when a waiter's wait ends (creditWait, spanWait)
	consumed   uint32              // data messages our Recv took
	returned   uint32              // consumed, as the last credit frame we sent said
	returning  bool                // returnCredits is running
	returnAll  bool                // returnCredits returns what is owed, below the threshold too (owedCreditsLocked)
	lookedAt   uint32              // consumed, at the janitor's last look (owedCreditsLocked)
	owedTimer  *time.Timer         // returns what owedCreditsLocked would, sooner (see armOwedLocked); made with the first arming
	owedArmed  bool                // owedTimer is set
	owedAt     uint32              // consumed, when owedTimer was set
	owedDelay  time.Duration       // owedTimer's next delay, minOwed to maxOwed
	beatWaits  bool                // a keepalive waits for room in a full send queue (keepaliveWhenRoom)
	returnFn   func()              // c.returnCredits and e.wg.Done, made once for spawnDone
	// creditFrames counts the credit frames sent (CreditFrames); atomic,
	// read without e.mu.
	creditFrames atomic.Uint64

	// receiving leg
	recvLeg      *acceptedLeg
	recvTag      uint32
	recvUp       bool
	unaccepted   bool          // counted in Endpoint.unaccepted
	queued       bool          // put in Endpoint.acceptq: counted until it leaves, finished or not
	term         chan struct{} // the accepting term it was queued in (its acceptStop)
	recvReleased bool
	lastSeen     time.Time
	goneAt       time.Time // the sender's INI was torn down
	goneDrains   uint64    // e.drains then
	goneLink     *downlink // the link whose DREQ set goneAt: the leg is gone while still on it
	// sendGone: our sending leg ended with its receiver's endpoint gone
	// (its MOVE refused NO_LISTENER) while the receiving leg waits for
	// the peer's FIN that may still sit in the SRQ: what Send returns,
	// and the failure once the SRQ has drained without it
	// (Endpoint.endGoneSenders).
	sendGone     error
	finRcvd      bool              // the peer's data ended (its FIN, half or not)
	peerClosed   bool              // its FIN was not half: it closed
	twoExchanges bool              // a dial that asks for the reverse leg by its own exchange (no FlagOneExchange; see Endpoint.Dial)
	earlyTag     uint32            // the receive tag announced in a FlagOneExchange VIRT_REQ, until registered
	early        []earlyMsg        // messages for earlyTag that came before the registration
	revInFlight  bool              // takeReverse is registering earlyTag: it, not dropEarlyLocked, gives the tag back
	revErr       error             // why the reverse leg in the forward ACCEPT could not be registered
	revTaken     bool              // the reverse leg in the forward ACCEPT is registered
	awaitFirst   bool              // inbound: up at the dialer's first frame (see Endpoint.consumeLocked)
	q            ring.Ring[[]byte] // data frames (kind and number included) for Recv (made with the first, maxQueued long)
	seen         replayWindow      // data sequence numbers taken (made with the first message)
	wakeCh       chan struct{}

	userClosed  bool
	writeClosed bool // CloseWrite: our data ended, the leg stays for credits
	halfFINSent bool // CloseWrite's FIN went (one that gave up sent nothing)
	closing     bool
	closeDone   chan struct{} // closed when the close that set closing is done
	closedUp    bool          // that close was done with c up: what fails after is no failure of c (Err)
	isReady     bool
	finished    bool
	err         error
	ready       chan struct{}
	done        chan struct{}
}

func (e *Endpoint) newConnLocked(raddr netip.AddrPort) *Conn {
	c := &Conn{e: e, raddr: raddr, wakeCh: make(chan struct{}, 1), ready: make(chan struct{}), done: make(chan struct{}),
		credited: make(chan struct{}), turn: make(chan struct{}, 1), closeDone: make(chan struct{})}
	c.returnFn = func() {
		defer e.wg.Done()
		c.returnCredits()
	}
	e.conns[c] = struct{}{}
	return c
}

// ok reports whether c is a connection an endpoint made: a nil or zero
// Conn is a closed one, whose calls fail with ErrClosed itself (it has no
// address to name) and whose accessors give their zero values, as cm's.
func (c *Conn) ok() bool { return c != nil && c.e != nil }

// LocalAddr is our endpoint's listening address.
func (c *Conn) LocalAddr() netip.AddrPort {
	if !c.ok() {
		return netip.AddrPort{}
	}
	return c.e.addr
}

// RemoteAddr is the peer endpoint's listening address.
func (c *Conn) RemoteAddr() netip.AddrPort {
	if !c.ok() {
		return netip.AddrPort{}
	}
	return c.raddr
}

// MaxMessageSize is the largest message Send takes on c: what the peer
// endpoint receives (its Config.MaxMessageSize), learned when the leg was
// set up.
func (c *Conn) MaxMessageSize() int {
	if !c.ok() {
		return 0
	}
	c.e.mu.Lock()
	defer c.e.mu.Unlock()
	return c.sendMax
}

// MaxRecvSize is the largest message c may receive: what our endpoint
// takes (its Config.MaxMessageSize). A Recv buffer of this size always fits.
func (c *Conn) MaxRecvSize() int {
	if !c.ok() {
		return 0
	}
	return c.e.cfg.MaxMessageSize
}

// CreditFrames is the number of credit frames (flow control) sent on c:
// its share of Stats.CreditFrames.
func (c *Conn) CreditFrames() uint64 {
	if !c.ok() {
		return 0
	}
	return c.creditFrames.Load()
}

// Err is what ended c, if a failure did: nil while c is up, and once it
// ended by Close or the peer's FIN (whatever failed after either). A Send
// that found the receiver's endpoint gone does not decide it: the FIN may
// still be in our queue (then nil), or the connection fails soon after.
// After a half FIN (the peer's CloseWrite), the peer's death is no failure
// either, as over RC, where a FIN and then a disconnect is all a peer's
// CloseWrite and Close send, and all a peer that half-closed and died
// leaves: its silence (the idle timeout, a recovery it does not answer)
// still is one. Nor is what fails after our Close has sent its FIN (the
// peer dies before its FIN answers ours), as over RC, where Close releases
// the connection.
func (c *Conn) Err() error {
	if !c.ok() {
		return nil
	}
	c.e.mu.Lock()
	defer c.e.mu.Unlock()
	err := c.errLocked()
	if c.peerClosed || c.closedUp || c.finRcvd && senderDead(err) {
		return nil
	}
	return err
}

// errLocked is c.err, or ErrProcessDied where the process died and die has
// not failed c yet (as failLocked would): a dead process fails its
// connections from its Kill on, not from when a loop's kernel call says it.
func (c *Conn) errLocked() error {
	if c.err == nil && !c.finished && !c.e.closed {
		return c.e.processErr()
	}
	return c.err
}

func (c *Conn) failed() bool { return c.err != nil }

func (c *Conn) errOr(def error) error {
	c.e.mu.Lock()
	defer c.e.mu.Unlock()
	if c.err != nil {
		return c.err
	}
	return def
}

func (c *Conn) wake() {
	select {
	case c.wakeCh <- struct{}{}:
	default:
	}
}

// Send sends p as one message. It returns once the message is posted on
// the uplink's INI, as an RC send does, so one goroutine can stream; the
// engine keeps the message until its completion comes and sends it again
// on the new INI if the uplink recovers meanwhile (its sequence number lets
// the receiver drop the copy if the first arrived after all). Messages of
// one connection are posted, and arrive, in the order their Sends took
// their turn. A failure after the post (the receiver gone, the uplink not
// recovered) ends the connection and is what the next call returns; when
// the peer's endpoint went while its FIN may still be on its way, it ends
// only the sending side first (the next Send says ErrPeerGone), and Recv
// reads what the peer sent until its FIN comes or the wait for it ends. A
// Send that waits (for its turn, a credit, room in the send queue) returns
// ctx's error when ctx ends first; when the connection has ended too, why it
// ended, as Recv does.
func (c *Conn) Send(ctx context.Context, p []byte) error {
	if !c.ok() {
		return ErrClosed
	}
	if len(p) > MaxMessageSize {
		return &OpError{"send", c.raddr.String(), fmt.Errorf("%w: %d bytes, limit %d", ErrMessageTooLong, len(p), MaxMessageSize)}
	}
	frame := kernel.NewPayload(1 + dataSeqLen + len(p))
	frame[0] = kindData
	copy(frame[1+dataSeqLen:], p)
	posted, err := c.sendData(ctx, frame)
	if !posted {
		kernel.FreePayload(frame)
	}
	if err != nil {
		if _, ok := err.(*OpError); !ok {
			// The context's end, while Send waited for its turn, for
			// credits, for the uplink or for room: an *OpError too.
			err = &OpError{"send", c.raddr.String(), err}
		}
	}
	return err
}

// outFrame is a data message whose completion has not come: the engine
// keeps it to send again across a recovery.
type outFrame struct {
	seq   uint32
	frame []byte // from kernel.NewPayload: kind, seq, message
	q     *iniQP // the INI of its latest post
	wrid  uint64
	tries int // posts again after an INI that failed (iniQP.erred)
}

// maxTries is how many times a frame is posted again after its INI failed
// before its connection fails with errRetries.
const maxTries = 16

// sendErrLocked is why nothing more can be sent on c, or nil. FIN and
// credit frames (internal) go out after the application closed.
func (c *Conn) sendErrLocked(internal bool) error {
	switch {
	case (c.userClosed || c.writeClosed) && !internal:
		return ErrClosed
	case c.peerClosed && !internal:
		// Before err: a failure after the peer's FIN (a frame of ours
		// in flight met its receive queue gone) does not undo its
		// orderly end.
		return ErrPeerClosed
	case c.errLocked() != nil:
		return c.errLocked()
	case c.sendGone != nil:
		return c.sendGone
	case !c.sendUp || c.sendDone:
		return ErrClosed
	}
	return nil
}

// takeTurn waits for c's send turn, which orders posts on the connection:
// a data frame is numbered and posted, or handed over, in one turn.
func (c *Conn) takeTurn(ctx context.Context) error {
	select {
	case c.turn <- struct{}{}:
		return nil
	default:
	}
	select {
	case c.turn <- struct{}{}:
		return nil
	case <-c.done:
		return c.endedSendErr()
	case <-c.e.ctx.Done():
		return c.endedSendErr()
	case <-ctx.Done():
		// Ended with c too, ctx is no reason either: with the turn
		// free, the connection's end is what a Send says
		// (TestSendWaitingForTurnEndedContextSaysWhyConnEnded).
		select {
		case <-c.done:
		case <-c.e.procDead: // the death ends c from its Kill on, as in sendData
		case <-c.e.ctx.Done():
		default:
			return ctx.Err()
		}
		return c.endedSendErr()
	}
}

// endedSendErr is a Send's error once c or its endpoint ended while it
// waited: why nothing more can be sent, as when nothing waits (the peer's
// FIN says ErrPeerClosed, a device loss ErrDeviceRemoved). The endpoint
// ends only after it failed or closed each connection (die, Close), so
// its end alone, which a select may pick before c's, is no reason: it
// said ErrClosed, which cm takes for the application's Close
// (TestSendWaitingForTurnSaysWhyItEnded).
func (c *Conn) endedSendErr() error {
	c.e.mu.Lock()
	err := c.sendErrLocked(false)
	c.e.mu.Unlock()
	return &OpError{"send", c.raddr.String(), cmp.Or(err, ErrClosed)}
}

func (c *Conn) endTurn() { <-c.turn }

// sendData numbers frame and posts it, first waiting (honouring ctx) for a
// credit, for the replay span, and for the uplink to be up. It reports
// whether the engine took the frame: then it is posted, or queued for a
// recovery to post, and the caller no longer owns it.
func (c *Conn) sendData(ctx context.Context, frame []byte) (bool, error) {
	e := c.e
	for {
		if err := c.takeTurn(ctx); err != nil {
			return false, err
		}
		e.mu.Lock()
		if err := c.sendErrLocked(false); err != nil {
			e.mu.Unlock()
			c.endTurn()
			return false, &OpError{"send", c.raddr.String(), err}
		}
		if n := len(frame) - 1 - dataSeqLen; n > c.sendMax {
			e.mu.Unlock()
			c.endTurn()
			return false, &OpError{"send", c.raddr.String(), fmt.Errorf("%w: %d bytes, the receiver takes %d", ErrMessageTooLong, n, c.sendMax)}
		}
		var wait <-chan struct{}
		u := c.up
		switch {
		case c.sent-c.acked >= c.sendWindow:
			c.creditWait = true
			wait = c.credited
		case c.spanFullLocked():
			wait = c.credited
		case u.state != upUp || c.unmoved:
			wait = u.changed
		}
		if wait != nil {
			woken := c.credited // also Close's wake-up while the uplink is down
			e.mu.Unlock()
			c.endTurn()
			select {
			case <-wait:
			case <-woken:
			case <-c.done:
			case <-e.procDead: // as in Recv
			case <-e.ctx.Done():
				return false, c.endedSendErr()
			case <-ctx.Done():
				// Ended with c or its endpoint too, ctx is no reason:
				// the cases above answer, as in takeTurn
				// (TestSendWaitingEndedContextSaysWhyConnEnded).
				if closed(e.ctx.Done()) {
					return false, c.endedSendErr()
				}
				if !closed(c.done) && !closed(e.procDead) {
					return false, ctx.Err()
				}
			}
			continue
		}
		// Take a credit and a number, and keep the frame for resends.
		if c.out.Len() == c.out.Cap() {
			// Grown as messages wait for completions, up to the replay
			// span (spanFullLocked keeps Len below it): made at the span,
			// a peer's window of 65535 cost 7 MiB at the first Send.
			c.out.Grow(min(max(64, 2*c.out.Cap()), int(replaySpan(int(c.sendWindow)))))
		}
		c.sent++
		seq := c.sendSeq
		c.sendSeq++
		binary.BigEndian.PutUint32(frame[1:], seq)
		q := u.cur
		q.nextWR++
		wrid := q.nextWR
		q.waiters[wrid] = waiter{c: c, seq: seq, data: true}
		c.out.Push(outFrame{seq: seq, frame: frame, q: q, wrid: wrid, tries: 1})
		sent := sentMark{before: c.lastSent, at: time.Now(), q: c.lastQ, wr: c.lastWR}
		c.lastQ, c.lastWR, c.lastSent = q, wrid, sent.at
		polls := q.polls
		e.mu.Unlock()
		taken, err := c.postData(ctx, u, q, wrid, frame, polls, sent)
		c.endTurn()
		return taken, err
	}
}

// sentMark is what a Send (or an internal frame) changed of its leg's last
// frame: lastSent (before, at) and lastQ, lastWR (q, wr before it), for a
// frame that never went to set them back, unless a frame posted since set
// them anew. Repeated Sends taken back, each a heartbeat's delay of the leg's
// keepalive, held it back for as long as they went on (a review).
type sentMark struct {
	before, at time.Time
	q          *iniQP
	wr         uint64
}

// takeBackLocked sets c's last frame back to what it was before a frame,
// request wr on q, that never went (m), unless a frame since set it anew.
func (c *Conn) takeBackLocked(m sentMark, q *iniQP, wr uint64) {
	if c.lastSent == m.at {
		c.lastSent = m.before
	}
	if c.lastQ == q && c.lastWR == wr {
		c.lastQ, c.lastWR = m.q, m.wr // a frame before it may still wait
		if w, ok := q.waiters[m.wr]; m.q == q && (!ok || w.c != c) {
			// That frame went back too (a Send's and an internal
			// frame's posts interleaved), or completed: the newest of
			// ours still in the queue is the last, if any.
			var newest uint64 // request ids start at 1
			for id, w := range q.waiters {
				if w.c == c && id < wr && id > newest {
					newest = id
				}
			}
			if newest != 0 {
				c.lastWR = newest
			}
		}
	}
}

// postData posts c's newest kept frame as request wrid on q, during the
// connection's turn. A full send queue (ENOMEM: completions not yet polled
// hold every slot) is no error of the INI: it waits until the INI's poller
// has taken completions and posts again, or, if ctx ends first, takes the
// frame back with its number and credit (taken false). Any other error
// fails the INI, and the recovery posts the frame. polls is q.polls as it
// was before the first try (see iniQP.polls).
func (c *Conn) postData(ctx context.Context, u *uplink, q *iniQP, wrid uint64, frame []byte, polls uint64, sent sentMark) (taken bool, err error) {
	e := c.e
	wrs := sendWRs.get(newSendWRs)
	defer func() {
		wrs[0] = kernel.SendWR{}
		sendWRs.put(wrs)
	}()
	wrs[0] = kernel.SendWR{WRID: wrid, RemoteSRQN: c.peerSRQN, Imm: c.peerTag, Payload: frame}
post:
	for bare := 0; ; {
		err := e.k.PostSend(q.qp, wrs[:])
		if err == nil {
			return true, nil
		}
		e.mu.Lock()
		if taken, err := c.unpostedLocked(q, wrid); taken {
			e.mu.Unlock()
			return true, err
		}
		full := errors.Is(err, syscall.ENOMEM)
		if !full || u.cur != q || u.state != upUp {
			e.failINILocked(u, q) // the recovery posts it
			e.mu.Unlock()
			return true, nil
		}
		if q.polls != polls { // polled since this try began: a slot is free
			polls = q.polls
			e.mu.Unlock()
			continue
		}
		if len(q.waiters) == 1 { // only ours: nothing posted holds the queue
			if bare++; bare == maxTries {
				e.failINILocked(u, q)
				e.mu.Unlock()
				return true, nil
			}
			e.mu.Unlock()
			continue
		}
		room := e.awaitRoomLocked(q)
		woken := c.credited // Close and CloseWrite wake it (wakeSendersLocked)
		e.mu.Unlock()
		userEnded := false
	wait:
		for {
			select {
			case <-room:
				e.mu.Lock()
				if taken, err := c.unpostedLocked(q, wrid); taken {
					e.mu.Unlock()
					return true, err
				}
				again := u.cur == q && u.state == upUp
				polls = q.polls
				e.mu.Unlock()
				if again {
					continue post
				}
				return true, nil // the INI failed: its recovery posts the frame
			case <-woken:
				e.mu.Lock()
				if taken, err := c.unpostedLocked(q, wrid); taken {
					e.mu.Unlock()
					return true, err
				}
				userEnded = c.userClosed || c.writeClosed
				woken = c.credited
				e.mu.Unlock()
				if userEnded {
					break wait
				}
			case <-c.done:
				return c.unposted(q, wrid) // taken: the connection ended
			case <-e.procDead: // as in sendData; never posted: taken back below
				break wait
			case <-e.ctx.Done():
				return true, c.endedSendErr()
			case <-ctx.Done():
				// Ended with c or its endpoint too, ctx is no reason:
				// the cases above answer, as in takeTurn
				// (TestSendWaitingEndedContextSaysWhyConnEnded).
				if closed(e.ctx.Done()) {
					return true, c.endedSendErr()
				}
				if closed(c.done) {
					return c.unposted(q, wrid)
				}
				break wait
			}
		}
		e.mu.Lock()
		if !c.lastIsLocked(q, wrid) {
			e.mu.Unlock()
			return true, nil // a recovery took it over
		}
		// Never posted: take back its number and credit, and its time:
		// nothing went, so the janitor's keepalive is due as before it.
		delete(q.waiters, wrid)
		c.out.DropLast()
		c.sendSeq--
		c.sent--
		c.takeBackLocked(sent, q, wrid)
		if int32(c.sent-c.acked) < 0 {
			c.acked = c.sent // a peer's count took it for sent: never past what was
		}
		c.wakeSendersLocked()
		var ended error
		if closed(e.procDead) {
			// c ended with the process (or our Close first): ctx is no
			// reason, and nil would pass the frame for sent.
			ended = cmp.Or(c.sendErrLocked(false), ErrClosed)
		}
		e.mu.Unlock()
		switch {
		case userEnded:
			return false, &OpError{"send", c.raddr.String(), ErrClosed}
		case ended != nil:
			return false, &OpError{"send", c.raddr.String(), ended}
		}
		return false, ctx.Err()
	}
}

// lastIsLocked reports whether c's newest kept frame is still the one to
// be posted as wrid on q: no recovery moved it to another INI.
func (c *Conn) lastIsLocked(q *iniQP, wrid uint64) bool {
	if c.out.Len() == 0 {
		return false
	}
	f := c.out.At(c.out.Len() - 1)
	return f.q == q && f.wrid == wrid
}

// unposted is unpostedLocked under e.mu.
func (c *Conn) unposted(q *iniQP, wrid uint64) (bool, error) {
	c.e.mu.Lock()
	defer c.e.mu.Unlock()
	return c.unpostedLocked(q, wrid)
}

// unpostedLocked tells postData, between tries of the post of wrid on q,
// whether the frame is out of its hands (taken): a recovery moved it to
// another INI, to post it there (err nil), or the connection ended with it
// never posted, which the Send must report (err: why the connection
// ended), not pass for a message on its way.
func (c *Conn) unpostedLocked(q *iniQP, wrid uint64) (taken bool, err error) {
	if !c.lastIsLocked(q, wrid) {
		return true, nil
	}
	if c.sendDone || c.err != nil {
		return true, &OpError{"send", c.raddr.String(), cmp.Or(c.sendErrLocked(false), ErrClosed)}
	}
	return false, nil
}

// spanFullLocked reports whether the next data message's number would be
// the receiver's replay span or more ahead of the oldest one whose
// completion has not come: sent again, that one could then arrive behind
// the receiver's window and be taken for a duplicate. (It also bounds what
// the connection keeps for resends.) The sender waits, as for credits.
func (c *Conn) spanFullLocked() bool {
	if c.out.Len() > 0 && c.sendSeq-c.out.Peek().seq >= replaySpan(int(c.sendWindow)) {
		c.spanWait = true
		return true
	}
	return false
}

// completedLocked takes the success of data frame seq's latest post: it
// and every frame kept before it (posted earlier on the same INI, whose
// completions come in order) are delivered and their memory is reused.
func (c *Conn) completedLocked(seq uint32) {
	for c.out.Len() > 0 && int32(seq-c.out.Peek().seq) >= 0 {
		kernel.FreePayload(c.out.Pop().frame)
	}
	if c.spanWait {
		c.spanWait = false
		c.wakeSendersLocked()
	}
}

// wakeSendersLocked ends the waits of senders blocked on credits or span.
func (c *Conn) wakeSendersLocked() {
	c.creditWait, c.spanWait = false, false
	close(c.credited)
	c.credited = make(chan struct{})
}

// resend posts again, on q, every frame c keeps, in order: the sending
// half of a recovery that moved c's leg to q. It takes c's turn, so no
// Send posts in between.
func (c *Conn) resend(ctx context.Context, u *uplink, q *iniQP) {
	e := c.e
	if c.takeTurn(ctx) != nil {
		return
	}
	defer c.endTurn()
	e.mu.Lock()
	if c.sendErrLocked(true) != nil {
		e.mu.Unlock()
		return
	}
	wrs := make([]kernel.SendWR, 0, c.out.Len()+1)
	// counted: wrs[0] is a keepalive, counted in c.keepalives, which a
	// post that fails takes back: counted, it made abortFirst take a dial
	// whose first frame had not gone for committed, and Dial returned it
	// after its context ended (TestDialResendKeepaliveNotPostedIsNoFirstFrame).
	counted := false
	probe := !c.firstDue && (c.firstHeld || c.awaitFirst || c.abandoned)
	if c.firstDue || u.pollFails > 0 && (c.isReady || probe) {
		// The first frame posted may have been flushed with the old INI:
		// a FIN that went first would end the acceptor's half as an
		// abandoned attempt, though Dial returned the connection. And a
		// recovery that a failed poll started proves q's poll with a
		// completion, which may not come otherwise before a one-off
		// failure later, taken for a poll that always fails (pollFails).
		// Not as a first frame not due yet: a dial not up both ways
		// (firstHeld) sends the probe its keepalives go as (post; a
		// keepalive would complete the acceptor's half), and so do an
		// inbound half before the dialer's first frame (awaitFirst: no
		// keepalive nor data, but a count of 0 credits the dialer
		// nothing) and a given-up dial, whose FIN is to be the first
		// frame. Without it an uplink whose legs were all such dials or
		// halves proved nothing, and a one-off failure later failed them
		// (TestHeldDialSendPollFailsTwiceApart,
		// TestAwaitFirstSendPollFailsTwiceApart). A FIN not posted yet
		// waits for the MOVEs (finHeldLocked) and follows the frame:
		// taken for sent, it left the new INI unproved while another
		// leg's MOVE was slow, and a one-off failure then failed that
		// leg (TestClosingLegSendPollFailsTwiceApart,
		// TestAbandonedDialSendPollFailsTwiceApart). So does a FIN
		// posted already (finPosted) whose completion the failed poll
		// lost: it may have arrived, but its receiver took our MOVE, so
		// it held the leg then, and the frame goes where the FIN's copy
		// goes anyway (at worst dropped by a receiver that let the leg
		// go since, or failing q as that copy would, where the leg was
		// the last on q's TGT). Sent nothing, such a leg left q
		// unproved too (TestPostedFINLostSendPollFailsTwiceApart,
		// TestPostedFINLostPhysLegSendPollFailsTwiceApart).
		q.nextWR++
		q.waiters[q.nextWR] = waiter{c: c, probe: probe}
		c.lastQ, c.lastWR = q, q.nextWR
		frame := keepaliveFrame
		if probe {
			frame = probeFrame
		} else {
			c.keepalives++
			counted = true
		}
		wrs = append(wrs, kernel.SendWR{WRID: q.nextWR, RemoteSRQN: c.peerSRQN, Imm: c.peerTag, Payload: frame})
	}
	for i := range c.out.Len() {
		f := c.out.At(i)
		delete(f.q.waiters, f.wrid)
		if f.q.erred {
			if f.tries++; f.tries > maxTries {
				c.failLocked(errRetries)
				e.mu.Unlock()
				return
			}
		}
		q.nextWR++
		f.q, f.wrid = q, q.nextWR
		q.waiters[f.wrid] = waiter{c: c, seq: f.seq, data: true}
		c.lastQ, c.lastWR = q, f.wrid
		wrs = append(wrs, kernel.SendWR{WRID: f.wrid, RemoteSRQN: c.peerSRQN, Imm: c.peerTag, Payload: f.frame})
	}
	polls := q.polls
	e.mu.Unlock()
	for i := 0; i < len(wrs); {
		err := e.k.PostSend(q.qp, wrs[i:i+1])
		if err == nil {
			i++
			continue
		}
		e.mu.Lock()
		full := errors.Is(err, syscall.ENOMEM)
		if full && q.polls != polls { // polled since this try began: a slot is free
			polls = q.polls
			e.mu.Unlock()
			continue
		}
		if !full || len(q.waiters) <= len(wrs)-i {
			// Not a full queue, or one that nothing posted holds (only
			// our unposted frames are registered).
			q.broken = true // this INI fails once the recovery ends
			if counted && i == 0 {
				c.keepalives-- // it did not go (see counted)
			}
			e.mu.Unlock()
			return
		}
		room := e.awaitRoomLocked(q)
		e.mu.Unlock()
		select {
		case <-room:
			e.mu.Lock()
			polls = q.polls
			e.mu.Unlock()
		case <-ctx.Done():
			e.mu.Lock()
			q.broken = true
			if counted && i == 0 {
				c.keepalives-- // it did not go (see counted)
			}
			e.mu.Unlock()
			return
		}
	}
}

// keepaliveFrame is a keepalive's frame, for posts that send it as it is
// (PostSend copies it).
var keepaliveFrame = []byte{kindHeartbeat}

// probeFrame is, likewise, the credit frame a dial not up yet sends for a
// keepalive (see post and heldProbe), and a recovery's resend for an
// inbound half that has not had its dialer's first frame or a given-up
// dial.
var probeFrame = append([]byte{kindCredit}, heldProbe[:]...)

// sendFrame sends one internal frame (FIN, credits) and waits for its
// completion, sending it again across an uplink recovery. Internal frames
// take no credit and no number: the engine, not the application, consumes
// them, and a second copy changes nothing. A FIN takes the connection's
// turn to post, so that it follows every data frame posted before it.
//
// As for data frames (Conn.resend), a completion in error counts a try only
// when the INI it was posted on failed (iniQP.erred): a flush by a rebuild
// for a TGT_GONE, a DREQ or a full send queue does not, or a dial to a liar
// would use up the tries of a FIN held behind a slow receiver's window
// (TestLiarDialKeepsQueuedFIN). Each flushed post waits for the uplink's
// next recovery (the loop waits until it is up again), so what bounds the
// frame then is what bounds the rebuilds, ctx and the connection's end.
func (c *Conn) sendFrame(ctx context.Context, kind byte, p []byte) error {
	return c.sendFrameNotify(ctx, kind, p, nil)
}

// sendFrameNotify is sendFrame that closes posted, if not nil, once the
// frame is first posted (a CloseWrite returns then, as a Send does).
func (c *Conn) sendFrameNotify(ctx context.Context, kind byte, p []byte, posted chan struct{}) error {
	e := c.e
	for try := 0; try < maxTries; try++ {
		e.mu.Lock()
		if err := c.sendErrLocked(true); err != nil {
			e.mu.Unlock()
			return &OpError{"send", c.raddr.String(), err}
		}
		if kind != kindFIN && c.finOut {
			// A credit frame due when our FIN went: post refuses it.
			e.mu.Unlock()
			return &OpError{"send", c.raddr.String(), ErrClosed}
		}
		u := c.up
		if u.state != upUp || c.unmoved || c.finHeldLocked(kind) {
			ch := u.changed
			e.mu.Unlock()
			select {
			case <-ch:
			case <-c.done:
			case <-ctx.Done():
				return ctx.Err()
			}
			try-- // waiting for the uplink is not a try
			continue
		}
		e.mu.Unlock()
		if kind == kindFIN {
			if err := c.takeTurn(ctx); err != nil {
				return err
			}
		}
		ch := statusChans.get(newStatusChan)
		res, room, q := c.post(kind, p, ch)
		if kind == kindFIN {
			c.endTurn()
		}
		switch res {
		case postFull:
			statusChans.put(ch) // its waiter was never seen by a poller
			select {
			case <-room:
			case <-c.done:
			case <-e.ctx.Done():
				return &OpError{"send", c.raddr.String(), ErrClosed}
			case <-ctx.Done():
				return ctx.Err()
			}
			try-- // waiting for the send queue is no failed try
			continue
		case postFailed:
			// Not reused: a poller flushing the INI may have taken its
			// waiter and still send to it.
			if q == nil {
				// Nothing posted: the leg or uplink changed while we
				// waited for the turn (the next look waits or fails).
				try--
			}
			continue
		}
		if posted != nil {
			close(posted)
			posted = nil
			// Posted: CloseWrite has returned nil, and the FIN is the
			// engine's to deliver, as a posted data frame is, until the
			// connection or the endpoint ends. ctx bounded only the wait
			// to post it: given up at its deadline, a FIN flushed later
			// by a recovery went nowhere, and the peer never read io.EOF.
			ctx = e.ctx
		}
		select {
		case st := <-ch:
			// The poller sent the one status it had for it: free to reuse.
			// (A wait that gave up leaves its channel to the collector.)
			statusChans.put(ch)
			switch st {
			case verbs.WCSuccess:
				return nil
			case verbs.WCRemInvReqErr:
				return &OpError{"send", c.raddr.String(), errSRQGone}
			}
			// Flushed or retries exhausted: the uplink recovers; again.
			// Only a post on an INI that failed counts (the poller set
			// erred before it sent the status).
			e.mu.Lock()
			erred, closing := q.erred, e.closed
			e.mu.Unlock()
			if closing {
				// A closing endpoint rebuilds no uplink: a post again
				// would go to the same failed INI.
				return &OpError{"send", c.raddr.String(), ErrClosed}
			}
			if !erred {
				try--
			}
		case <-e.ctx.Done():
			// The endpoint is closing: its completion pollers are
			// gone, so no completion will come.
			return &OpError{"send", c.raddr.String(), ErrClosed}
		case <-c.done:
			// Ended: nothing waits for this frame, whose completion may
			// not come for as long as its INI waits behind a stalled
			// receiver.
			if succeeded(ch) {
				return nil
			}
			e.mu.Lock()
			err := cmp.Or(c.err, ErrClosed)
			e.mu.Unlock()
			return &OpError{"send", c.raddr.String(), err}
		case <-ctx.Done():
			if succeeded(ch) {
				return nil
			}
			return ctx.Err()
		}
	}
	c.fail(errRetries)
	return &OpError{"send", c.raddr.String(), errRetries}
}

// succeeded reports whether the completion status in ch, come already,
// is a success: a wait that ended as it came is the frame's success. Our
// half FIN's completion and the end of c that the peer's answering FIN
// brings come at once, and select picks either at random: CloseWrite
// failed with ErrClosed, though its FIN went and the application closed
// nothing (TestCloseWriteDeliveredFINIsNoError).
func succeeded(ch chan verbs.WCStatus) bool {
	select {
	case st := <-ch:
		if st == verbs.WCSuccess {
			statusChans.put(ch)
			return true
		}
	default:
	}
	return false
}

// finHeldLocked reports whether c's FIN, of kind, waits for the recovery of
// c's uplink: a FIN that ends our leg (not HALF) lets its receiver release
// its handle on the TGT, and the TGT dies with the last one. While the
// recovery still moves legs onto the rebuilt INI's TGT (settling), the legs
// moved already may hold it alone: their FINs wait until every MOVE is
// answered, as they did when the uplink came up only then.
func (c *Conn) finHeldLocked(kind byte) bool {
	return kind == kindFIN && c.finOut && c.up.settling
}

// statusChans and sendWRs keep sends from allocating: a channel for an
// internal frame's completion status, and the one-request array for
// PostSend.
var (
	statusChans = make(freeList[chan verbs.WCStatus], 1024)
	sendWRs     = make(freeList[*[1]kernel.SendWR], 1024)
)

func newStatusChan() chan verbs.WCStatus { return make(chan verbs.WCStatus, 1) }
func newSendWRs() *[1]kernel.SendWR      { return new([1]kernel.SendWR) }

// freeList keeps spare values for reuse, up to its capacity. A buffered
// channel rather than a sync.Pool: a pool drops what it holds at each
// garbage collection, and some at random under the race detector.
type freeList[T any] chan T

func (f freeList[T]) get(mk func() T) T {
	select {
	case v := <-f:
		return v
	default:
		return mk()
	}
}

func (f freeList[T]) put(v T) {
	select {
	case f <- v:
	default:
	}
}

// postResult is what became of an internal frame's post.
type postResult uint8

const (
	posted     postResult = iota
	postFailed            // not posted: the leg or the INI is down (recovery started), or a retry is due
	postFull              // not posted: the INI's send queue is full; wait for room and post again
)

// post posts one internal frame (FIN, credits, keepalive) on the uplink's
// current INI, which it returns as q (nil when it did not get that far);
// ch (if not nil) gets the completion status. A full send queue (ENOMEM) is no error of the INI: the
// caller waits on room, closed once the INI's poller has taken completions,
// and posts again.
func (c *Conn) post(kind byte, p []byte, ch chan verbs.WCStatus) (res postResult, room <-chan struct{}, q *iniQP) {
	e := c.e
	e.mu.Lock()
	u := c.up
	// Nothing follows our full FIN (finOut): its receiver lets the leg go
	// on it, and with the leg perhaps the last handle on the TGT, where a
	// later frame finds none and fails the INI: a recovery for nothing.
	if !c.sendUp || (c.sendDone || c.abandoned || c.finOut) && kind != kindFIN || c.err != nil || u == nil || u.state != upUp || c.unmoved || c.finHeldLocked(kind) {
		e.mu.Unlock()
		return postFailed, nil, nil
	}
	if kind != kindFIN {
		c.internalPosts++
		defer c.internalPostDone()
	} else if c.finOut && c.internalPosts > 0 {
		if c.postsIdle == nil {
			c.postsIdle = make(chan struct{})
		}
		idle := c.postsIdle
		e.mu.Unlock()
		return postFull, idle, nil
	}
	probe := kind == kindHeartbeat && c.firstHeld
	if probe {
		// A dial not up yet (firstHeld): a keepalive would complete the
		// acceptor's half. A credit frame of no credits goes instead: it
		// finds a receiver that is gone as a keepalive does, and its
		// receiver takes it for no first frame (Endpoint.consumeLocked).
		kind, p = kindCredit, heldProbe[:]
	}
	if kind == kindHeartbeat {
		c.keepalives++
	}
	if kind == kindFIN && c.finOut {
		c.finPosted = true
	}
	q = u.cur
	q.nextWR++
	wr := kernel.SendWR{WRID: q.nextWR, RemoteSRQN: c.peerSRQN, Imm: c.peerTag}
	q.waiters[wr.WRID] = waiter{c: c, ch: ch, probe: probe}
	mark := sentMark{before: c.lastSent, at: time.Now(), q: c.lastQ, wr: c.lastWR}
	c.lastQ, c.lastWR, c.lastSent = q, wr.WRID, mark.at
	polls := q.polls
	e.mu.Unlock()
	// PostSend copies the frame: it and the request array are reused.
	frame := kernel.NewPayload(1 + len(p))
	defer kernel.FreePayload(frame)
	frame[0] = kind
	copy(frame[1:], p)
	wr.Payload = frame
	wrs := sendWRs.get(newSendWRs)
	wrs[0] = wr
	err := e.k.PostSend(q.qp, wrs[:])
	wrs[0] = kernel.SendWR{}
	sendWRs.put(wrs)
	if err != nil {
		e.mu.Lock()
		defer e.mu.Unlock()
		_, mine := q.waiters[wr.WRID] // else a poller flushing the INI took the waiter
		delete(q.waiters, wr.WRID)
		if kind == kindHeartbeat {
			c.keepalives-- // it did not go
		}
		// Nothing went: the janitor's next look sends a keepalive (it
		// waited a whole heartbeat, and a busy INI's full queue could drop
		// keepalive after keepalive past the idle timeout), and waits for
		// the frame before this one if that still waits.
		c.takeBackLocked(mark, q, wr.WRID)
		if errors.Is(err, syscall.ENOMEM) && mine {
			if q.polls != polls {
				return postFull, roomNow, q // polled meanwhile: a slot is free, no failed try
			}
			if len(q.waiters) == 0 {
				return postFailed, nil, q // nothing posted holds the queue: again (a try)
			}
			return postFull, e.awaitRoomLocked(q), q
		}
		e.failINILocked(u, q)
		return postFailed, nil, q
	}
	return posted, nil, q
}

// internalPostDone ends an internal frame's post (see internalPosts); post
// defers it, and it runs without the endpoint's lock held.
func (c *Conn) internalPostDone() {
	e := c.e
	e.mu.Lock()
	defer e.mu.Unlock()
	c.internalPosts--
	if c.internalPosts == 0 && c.postsIdle != nil {
		close(c.postsIdle)
		c.postsIdle = nil
	}
}

// frameWaitingLocked reports whether the newest frame registered on c's leg
// has not completed yet, on the INI a keepalive would go on (after a
// recovery, one left on the old INI is no reason to wait).
func (c *Conn) frameWaitingLocked() bool {
	if c.lastQ == nil || c.up == nil || c.lastQ != c.up.cur {
		return false
	}
	w, ok := c.lastQ.waiters[c.lastWR]
	return ok && w.c == c
}

// heldProbe is the body of the credit frame a dial not up yet sends for a
// keepalive (see post): a count of 0, which credits nothing.
var heldProbe [creditLen]byte

// roomNow is a wait for room that is over at once.
var roomNow = func() <-chan struct{} { ch := make(chan struct{}); close(ch); return ch }()

// Recv waits for the next message and copies it into buf. A message longer
// than buf stays queued, and Recv returns ErrMessageTooLong (a buffer of
// MaxRecvSize always fits). After the peer's FIN and the messages before
// it, Recv returns io.EOF. A queued message is returned whether or not ctx
// has ended; Recv returns ctx's error only when it has to wait and the
// connection has not ended.
func (c *Conn) Recv(ctx context.Context, buf []byte) (int, error) {
	if !c.ok() {
		return 0, ErrClosed
	}
	e := c.e
	for {
		e.mu.Lock()
		if c.userClosed {
			c.wake() // the next reader ends too (one wake-up per event)
			e.mu.Unlock()
			return 0, &OpError{"recv", c.raddr.String(), ErrClosed}
		}
		if c.q.Len() > 0 {
			if n := len(c.q.Peek()) - 1 - dataSeqLen; n > len(buf) {
				c.wake() // another reader, with room for it, may be waiting
				e.mu.Unlock()
				return 0, &OpError{"recv", c.raddr.String(), fmt.Errorf("%w: %d-byte message, %d-byte buffer", ErrMessageTooLong, n, len(buf))}
			}
			frame := c.q.Pop()
			if c.q.Len() > 0 {
				c.wake()
			}
			c.consumed++
			if c.consumed-c.returned >= creditThreshold(e.cfg.RecvWindow) {
				if !c.returning {
					c.returning = e.spawnDone(c.returnFn)
				}
				c.owedDelay, _ = e.owedBounds() // a reader that keeps up: a later stop is answered at once
			} else {
				c.armOwedLocked()
			}
			e.mu.Unlock()
			n := copy(buf, frame[1+dataSeqLen:])
			kernel.FreePayload(frame)
			return n, nil
		}
		if c.finRcvd {
			c.wake()
			e.mu.Unlock()
			return 0, io.EOF
		}
		if err := c.errLocked(); err != nil {
			c.wake()
			e.mu.Unlock()
			return 0, &OpError{"recv", c.raddr.String(), err}
		}
		e.mu.Unlock()
		select {
		case <-c.wakeCh:
		case <-c.done:
		case <-e.procDead: // the process's death ends c from its Kill on, not die's
		case <-ctx.Done():
			// Ended with c too, ctx is no reason: the loop says
			// why, as a Send's waits do
			// (TestRecvWaitingEndedContextSaysWhyConnEnded).
			if !closed(c.done) && !closed(e.procDead) {
				return 0, &OpError{"recv", c.raddr.String(), ctx.Err()}
			}
		}
	}
}

// creditLen is the body of a credit frame: the receiver's count of data
// messages its application has taken, uint32, wrapping.
const creditLen = 4

// creditThreshold is how many taken messages a receiver lets pile up before
// it returns their credits: half the window, so a sender that keeps the
// window full gets credits back before it runs out, at one credit frame per
// half window.
func creditThreshold(window int) uint32 { return uint32(max(1, window/2)) }

// replaySpan is how many sequence numbers a receiver with this window
// remembers (replayWindow): twice the window, rounded up to a power of two
// of at least 64 (whole words, and a ring that divides 2^32, so it stays
// consistent across the numbers' wrap).
func replaySpan(window int) uint32 {
	return max(64, uint32(1)<<bits.Len(uint(2*max(window, 1)-1)))
}

// maxQueued is how many received messages a connection holds before it
// takes its peer for broken: twice the window. A sender keeps within the
// window (a Send takes its credit back only for a message never posted);
// the slack is a margin, so that only a clearly broken or hostile sender
// is failed.
func maxQueued(window int) int { return 2 * window }

// returnCredits sends credit frames while the application has taken at
// least a threshold of messages since the last one. Each frame carries the
// running count, not a difference: a frame sent twice or late (across an
// uplink recovery) changes nothing. One runs per connection at a time; it
// ends when nothing more is due or the sending leg is gone. The count is
// marked returned before its frame goes and not undone if the frame fails:
// sendFrame fails only as our sending leg, the connection or the endpoint
// ends, or after our full FIN, and no credit frame goes after any of them
// (it waits out a recovery instead).
func (c *Conn) returnCredits() {
	e := c.e
	for {
		e.mu.Lock()
		v := c.consumed
		due := creditThreshold(e.cfg.RecvWindow)
		if c.returnAll {
			due = 1
		}
		if v-c.returned < due || c.err != nil || c.finRcvd || c.sendDone || !c.sendUp {
			c.returning, c.returnAll = false, false
			e.mu.Unlock()
			return
		}
		c.returned, c.returnAll = v, false
		e.mu.Unlock()
		var b [creditLen]byte
		binary.BigEndian.PutUint32(b[:], v)
		if err := c.sendFrame(e.ctx, kindCredit, b[:]); err != nil {
			e.mu.Lock()
			c.returning = false
			e.mu.Unlock()
			return
		}
		e.creditSent.Add(1)
		c.creditFrames.Add(1)
	}
}

// owedCreditsLocked, at each of the janitor's looks, returns the messages
// our application took below the threshold if it took none since the last
// look and the sender is at its window (all it may send has come, less what
// we returned): it waits for them, and a reader that stopped short of the
// threshold would never send them (each side waited for the other for ever,
// TestCreditTakenBelowThresholdGoesBack). owedTimer does the same sooner;
// this look is its fallback.
func (c *Conn) owedCreditsLocked() {
	v := c.consumed
	idle := v == c.lookedAt
	c.lookedAt = v
	if idle && c.senderWaitsLocked() {
		c.returnOwedLocked()
	}
}

// returnOwedLocked returns all that is owed, below the threshold too: a
// credit return running already takes it, else one starts.
func (c *Conn) returnOwedLocked() {
	if c.returning {
		c.returnAll = true
	} else if c.e.spawnDone(c.returnFn) {
		c.returning, c.returnAll = true, true
	}
}

// senderWaitsLocked reports whether our application took messages whose
// credits we have not returned while the sender is at its window: it can
// send nothing more until we return them.
func (c *Conn) senderWaitsLocked() bool {
	v := c.consumed
	return v != c.returned && !c.finRcvd && !c.sendDone && c.sendUp &&
		v+uint32(c.q.Len())-c.returned >= uint32(c.e.cfg.RecvWindow)
}

// minOwed and maxOwed bound owedTimer's delay: it starts short, as cm's
// persist timer does, so that a reader that stopped below the threshold
// returns its credits to a waiting sender at once rather than at the
// janitor's next look (up to a heartbeat), and doubles with each firing
// that finds the sender waiting, until a read reaches the threshold again:
// a reader that takes a message now and then returns credits by the
// threshold, not one frame per message.
const (
	minOwed = 200 * time.Microsecond
	maxOwed = 20 * time.Millisecond
)

// owedBounds is minOwed and maxOwed, or an hour each with owedOff: the
// timer then never answers within a test, leaving it to the janitor.
func (e *Endpoint) owedBounds() (lo, hi time.Duration) {
	if e.owedOff {
		return time.Hour, time.Hour
	}
	return minOwed, maxOwed
}

// armOwedLocked sets owedTimer, after a message taken or come, if the
// sender waits for credits below the threshold (at it, Recv returns them).
// The timer is made once and reset after: no allocation per message.
func (c *Conn) armOwedLocked() {
	if c.owedArmed || c.consumed-c.returned >= creditThreshold(c.e.cfg.RecvWindow) || !c.senderWaitsLocked() {
		return
	}
	c.owedArmed, c.owedAt = true, c.consumed
	if c.owedTimer == nil {
		c.owedDelay, _ = c.e.owedBounds()
		c.owedTimer = time.AfterFunc(c.owedDelay, c.owedFired)
	} else {
		c.owedTimer.Reset(c.owedDelay)
	}
}

// owedFired is owedTimer's: what the janitor's look does. If the
// application took nothing since the timer was set, the credits go back
// now; if it took more, the timer waits again, a reader that keeps reading
// reaching the threshold meanwhile.
func (c *Conn) owedFired() {
	e := c.e
	e.mu.Lock()
	defer e.mu.Unlock()
	c.owedArmed = false
	if c.err != nil || !c.senderWaitsLocked() {
		return
	}
	_, hi := e.owedBounds()
	c.owedDelay = min(2*c.owedDelay, hi)
	if c.consumed != c.owedAt {
		c.armOwedLocked()
		return
	}
	c.returnOwedLocked()
}

// creditedLocked takes a credit frame's body. It reports false for a
// malformed one.
func (c *Conn) creditedLocked(body []byte) bool {
	acked, ok := creditAck(body, c.acked, c.sent)
	if !ok {
		return false
	}
	if acked != c.acked {
		c.acked = acked
		if c.creditWait {
			c.wakeSendersLocked()
		}
	}
	return true
}

// creditAck decodes a credit frame's body (the receiver's running count of
// messages taken) and returns the new count of our messages taken, given
// the current one and the count sent. A count behind acked is a late frame
// and changes nothing; one ahead of sent is capped at it (a hostile or
// broken peer). So a peer's frame never moves acked back, nor past what was
// sent.
func creditAck(body []byte, acked, sent uint32) (uint32, bool) {
	if len(body) != creditLen {
		return acked, false
	}
	d := binary.BigEndian.Uint32(body) - acked
	if int32(d) <= 0 {
		return acked, true
	}
	return acked + min(d, sent-acked), true
}

// Close ends the connection gracefully: a FIN is the last message on our
// leg, then our reference on the uplink goes (at zero the uplink's physical
// link is disconnected and its INI destroyed after TIMEWAIT_EXIT). Our
// receiving leg ends when the peer's FIN arrives (the peer answers ours
// with its own) or its sender goes silent. Close waits at most
// Config.HandshakeTimeout: for its FIN's post and completion (a receive at
// the peer taking it, as cm's Close waits for a receive buffer at the peer:
// unlike CloseWrite, which returns once its FIN is posted, Close waits that
// long for a receiver that takes nothing in, a stopped process), and where
// a Send or the FIN found the receiver's endpoint gone, for the receive
// loop's verdict (the peer's FIN, or the failure that Err then reports).
// Close is idempotent.
func (c *Conn) Close() error {
	if !c.ok() {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.e.cfg.HandshakeTimeout)
	defer cancel()
	c.closeWithin(ctx)
	return nil
}

// closeUnaccepted closes, on a goroutine of its own, an inbound connection
// that StopAccepting left no Accept to take; e.mu is held. The endpoint's
// Close ends the wait for its FIN, as for its own.
func (c *Conn) closeUnaccepted() {
	c.acceptedLocked()
	e := c.e
	e.spawn(func() {
		ctx, cancel := context.WithTimeout(e.ctx, min(e.cfg.HandshakeTimeout, time.Second))
		defer cancel()
		c.closeWithin(ctx)
	})
}

func (c *Conn) closeWithin(ctx context.Context) {
	c.e.mu.Lock()
	c.userClosed = true
	c.wake()
	c.wakeSendersLocked() // a Send waiting for credits or the uplink fails now
	c.e.mu.Unlock()
	c.close(ctx)
}

// close sends our FIN and lets go of the sending leg. A close already under
// way is waited for, within ctx: the endpoint's Close must not tear the
// uplink down under a FIN that another Close (a user's, or StopAccepting's
// of a connection no Accept took) is sending.
func (c *Conn) close(ctx context.Context) {
	if !c.closeFirst(ctx) {
		c.awaitClose(ctx)
	}
}

// awaitClose waits, within ctx, for the close under way.
func (c *Conn) awaitClose(ctx context.Context) {
	select {
	case <-c.closeDone:
	case <-ctx.Done():
	}
}

// closeFirst is close for its first caller; a later one gets false, and
// nothing is done.
func (c *Conn) closeFirst(ctx context.Context) bool {
	e := c.e
	e.mu.Lock()
	if c.closing {
		e.mu.Unlock()
		return false
	}
	c.closing = true
	fin := c.sendUp && !c.sendDone && c.err == nil
	e.mu.Unlock()
	defer close(c.closeDone)
	var finErr error
	if fin {
		finErr = c.sendFIN(ctx, false)
	}
	e.mu.Lock()
	gone := c.sendGone != nil && c.err == nil
	e.mu.Unlock()
	if gone {
		// A Send or our FIN found the receiver's endpoint gone: its
		// FIN, if it sent one, is in our SRQ, and the receive loop's
		// next poll decides (endGoneSenders). Wait for that verdict:
		// ended here, the endpoint's Close would call a death
		// ErrClosed.
		select {
		case <-c.done:
		case <-ctx.Done():
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if c.err == nil && !c.isReady {
		c.failLocked(ErrClosed) // a half-open connection has no peer to say FIN
		return true
	}
	// A FIN that did not go (refused, flushed: the peer gone) leaves it
	// to the failure, as over RC a FIN or a drain that fails in Close
	// does; so does one not sent because a Send had found the receiver's
	// endpoint gone (sendGone): its FIN or the failure decides. One that
	// Close gave up waiting for is done with, as over RC.
	c.closedUp = c.err == nil && c.sendGone == nil && (finErr == nil || ctx.Err() != nil)
	c.dropSendLocked()
	c.maybeFinishLocked()
	return true
}

// answerDueLocked reports whether the peer's FIN that answers ours can still
// come, for the endpoint's Close, its listeners gone: our FIN was posted and
// its close was done with c up (a FIN refused or flushed went nowhere: the
// peer, gone, answers nothing), c has not failed since, the peer's FIN has
// not come (a half FIN's sender answers ours with its full one), our
// endpoint's process and device live, and the sender's INI is not known
// gone (only a MOVE, to a listener, would bring the leg back).
func (c *Conn) answerDueLocked() bool {
	return c.finPosted && c.closedUp && c.err == nil && !c.peerClosed &&
		c.e.lostErr() == nil && !c.senderGoneLocked()
}

// senderGoneLocked reports whether the receiving leg's sender is gone, its
// FIN perhaps still in our SRQ: the DREQ of its INI came (goneAt) and the
// leg is still on that link, or our MOVE found its endpoint gone (sendGone,
// no link). A MOVE decided since took the leg off the link, and its
// legMoved, after the kernel took our answer (or refused it), clears the
// mark (TestMoveDecidedAfterDREQKeepsLeg).
func (c *Conn) senderGoneLocked() bool {
	if c.goneAt.IsZero() {
		return false
	}
	return c.goneLink == nil || c.recvLeg == nil || onLink(c.e.acc.LegDownlink(c.recvLeg), c.goneLink)
}

// CloseWrite ends our data, as TCP's half-close does: a FIN flagged half
// goes after every message sent before it, the peer's Recv returns io.EOF
// after them, and our sending leg stays up, carrying the credit frames and
// keepalives the peer's messages need, until Close (or the peer's FIN, which
// ends the connection as ever). Send fails with ErrClosed from then on.
// CloseWrite is idempotent until the peer's FIN: after it (the peer's
// Close; not the half FIN of its CloseWrite, whose io.EOF at Recv leaves our
// side free to send and half-close) it returns ErrPeerClosed, as Send does,
// also after a CloseWrite of ours that returned nil, until our own Close
// (cm.Conn.CloseWrite keeps returning nil there). It returns once the FIN
// is posted, as Send does, never waiting for the peer: it waits only for
// the uplink and room in its send queue, at most Config.HandshakeTimeout
// (context.DeadlineExceeded after that, having sent nothing, so that a
// CloseWrite again sends it), and returns ErrClosed if the endpoint closes
// meanwhile. The engine waits for the FIN's completion, and posts it again
// across a recovery, as it does a posted data frame: until the connection
// (or the endpoint) ends, not within that timeout.
func (c *Conn) CloseWrite() error {
	if !c.ok() {
		return ErrClosed
	}
	e := c.e
	e.mu.Lock()
	err := c.closeWriteEndLocked()
	if err == nil && c.halfFINSent {
		e.mu.Unlock()
		return nil
	}
	if err != nil {
		e.mu.Unlock()
		return &OpError{"close write", c.raddr.String(), err}
	}
	// A CloseWrite whose FIN gave up (no room before its timeout) sent
	// nothing: this one sends it (TestCloseWriteAgainAfterItsFINFoundNoRoom).
	// Two at once may both send it, and a second copy changes nothing.
	c.writeClosed = true
	c.wakeSendersLocked() // a Send waiting for credits fails now
	e.mu.Unlock()
	// The FIN goes on a goroutine of the endpoint's: CloseWrite returns
	// once it is posted, as a Send does, and waits for no completion,
	// which a receiver that takes nothing in (a stopped process) holds
	// back. The goroutine waits for it, posting again across a recovery,
	// until the connection ends (the handshake timeout bounds only the
	// wait to post it first).
	posted := make(chan struct{})
	done := make(chan error, 1)
	if !e.spawn(func() {
		ctx, cancel := context.WithTimeout(e.ctx, e.cfg.HandshakeTimeout)
		defer cancel()
		done <- c.sendFINNotify(ctx, true, posted)
	}) {
		// The endpoint stopped after the checks above: a device's loss
		// (TestCloseWriteSpawnRefusedSaysWhyConnEnded), or its Close.
		return c.closeWriteErr(ErrClosed)
	}
	select {
	case <-posted:
	case err := <-done:
		select {
		case <-posted: // posted before it failed: the half-close went
		default:
			if err != nil {
				return c.closeWriteErr(err)
			}
		}
	}
	e.mu.Lock()
	c.halfFINSent = true
	e.mu.Unlock()
	return nil
}

// closeWriteEndLocked is why CloseWrite sends no FIN on c, or nil.
func (c *Conn) closeWriteEndLocked() error {
	switch {
	case c.peerClosed && !c.userClosed:
		// The peer's FIN closes our side too (answerFINLocked): not
		// ErrClosed, which says the application closed c, nor a
		// failure after the FIN. As Send.
		return ErrPeerClosed
	case c.errLocked() != nil && !c.closedUp:
		return c.errLocked()
	case c.userClosed || c.closing:
		return ErrClosed
	}
	return nil
}

// closeWriteErr is CloseWrite's error for err, its FIN's failure: an
// *OpError "close write", as CloseWrite's own, not sendFrame's "send". A
// FIN whose wait ended with the connection or the endpoint says why, as a
// CloseWrite called then does (closeWriteEndLocked; ErrClosed where the
// endpoint closed): its waits said ErrClosed, which cm takes for the
// application's Close, for a device lost or a peer gone, at the turn (a
// Send's error, ErrClosed after CloseWrite) and at random where select
// took the endpoint's end, or the FIN's context made from it (only
// context.Canceled), before the connection's
// (TestCloseWriteWaitingForTurnSaysWhyItEnded). A deadline stays what it
// is: the FIN found no room or no uplink within HandshakeTimeout.
func (c *Conn) closeWriteErr(err error) error {
	if oe, ok := err.(*OpError); ok {
		err = oe.Err
	}
	if errors.Is(err, ErrClosed) || c.e.ctx.Err() != nil && errors.Is(err, context.Canceled) {
		c.e.mu.Lock()
		err = cmp.Or(c.closeWriteEndLocked(), ErrClosed)
		c.e.mu.Unlock()
	}
	return &OpError{"close write", c.raddr.String(), err}
}

// sendFIN sends our FIN on the sending leg, after every data frame posted
// before it; half keeps the leg (CloseWrite).
func (c *Conn) sendFIN(ctx context.Context, half bool) error {
	return c.sendFINNotify(ctx, half, nil)
}

// sendFINNotify is sendFIN that closes posted once the FIN is posted
// (sendFrameNotify).
func (c *Conn) sendFINNotify(ctx context.Context, half bool, posted chan struct{}) error {
	c.e.mu.Lock()
	f := wire.FIN{Tag: c.peerTag, SenderTag: c.sendTag, Half: half}
	c.finOut = c.finOut || !half
	c.e.mu.Unlock()
	var b [wire.FinLen]byte
	if _, err := f.Encode(b[:]); err != nil {
		return err
	}
	return c.sendFrameNotify(ctx, kindFIN, b[:], posted)
}

// fail ends the connection at once, without FIN.
func (c *Conn) fail(err error) {
	c.e.mu.Lock()
	defer c.e.mu.Unlock()
	c.failLocked(err)
}

func (c *Conn) failLocked(err error) {
	if c.err != nil || c.finished {
		return
	}
	if dev := c.e.deviceErr(); dev != nil {
		err = dev // whatever failed, failed because the device did
	} else if pd := c.e.processErr(); pd != nil && !c.e.closed {
		err = pd // or because the process died (its calls say ErrClosed)
	}
	c.err = err
	c.dropSendLocked()
	var dl *downlink // a failed leg's, for legFailedLocked, if its sender is taken for dead
	if c.recvLeg != nil && !c.recvReleased && senderDead(err) {
		dl = c.e.acc.LegDownlink(c.recvLeg)
	}
	c.releaseRecvLocked()
	if dl != nil {
		c.e.legFailedLocked(dl)
	}
	c.maybeFinishLocked()
	c.wake()
}

// senderDead reports whether a leg's failure with err takes its sender for
// dead, so that the last leg's failure ends its physical link
// (legFailedLocked): a peer gone, but not by its silence (the idle timeout,
// a MOVE it did not answer: it may live) nor by a dial it gave up; nor a
// failure of ours (Close, a context, an overrun, a full accept queue). A
// live sender may open the TGT again through the link, and the link's DREQ
// ends that leg at its death (TestEndpointLinkOutlivesLegOfLiveSender,
// TestEndpointLinkOutlivesUnansweredLeg). A silent one that is dead
// leaves the link to linger (Endpoint.lingerLocked).
func senderDead(err error) bool {
	return errors.Is(err, ErrPeerGone) && !errors.Is(err, errIdle) && !errors.Is(err, errUnanswered) && !errors.Is(err, errAbandoned)
}

// finLocked consumes the peer's FIN: our receiving leg ends (the local count
// drops), and we answer with our own FIN unless we sent it already. A half
// FIN only ends the peer's data: the leg stays for its credit frames, and
// our side goes on until our Close or the peer's full FIN.
func (c *Conn) finLocked(half bool) {
	c.finRcvd = true
	c.wake()
	if half {
		return
	}
	c.peerClosed = true
	c.releaseRecvLocked()
	if c.isReady {
		c.answerFINLocked()
	}
	// Else the peer sent and closed before our sending leg came up (the
	// leg's exchange and the data path are not ordered). The connection
	// completes (checkReadyLocked answers then): Dial or Accept returns
	// it, and Recv gives what came before the FIN, then io.EOF. One that
	// never completes fails as ever (the dial's deadline, the reciprocal
	// leg refused).
	c.maybeFinishLocked()
}

// answerFINLocked closes c in the background after the peer's full FIN,
// sending ours.
func (c *Conn) answerFINLocked() {
	if c.closing {
		return
	}
	e := c.e
	e.spawn(func() {
		ctx, cancel := context.WithTimeout(e.ctx, e.cfg.HandshakeTimeout)
		defer cancel()
		c.close(ctx)
	})
}

func (c *Conn) dropSendLocked() {
	c.sendDone = true
	if c.owedTimer != nil {
		c.owedTimer.Stop() // nothing goes back on a sending leg gone
		c.owedArmed = false
	}
	if c.holdsRef {
		c.holdsRef = false
		u := c.up
		delete(u.legs, c)
		u.refs--
		c.e.maybeTeardownLocked(u)
	}
}

func (c *Conn) releaseRecvLocked() {
	c.e.dropEarlyLocked(c)
	if c.recvLeg == nil || c.recvReleased {
		return
	}
	c.recvReleased = true
	if c.e.recv[c.recvTag] == c {
		delete(c.e.recv, c.recvTag)
	}
	c.e.legLeftLocked(c.recvLeg)
	c.e.acc.Release(c.recvLeg)
}

// maybeFinishLocked forgets a connection whose legs are both gone.
func (c *Conn) maybeFinishLocked() {
	e := c.e
	if c.finished || !c.sendDone || (c.recvLeg != nil && !c.recvReleased) {
		return
	}
	c.finished = true
	if !c.queued {
		// Queued, it holds its slot until Accept takes it or
		// StopAccepting sweeps it: a queue full of connections that
		// finished there must refuse the next as a full one does.
		c.acceptedLocked()
	}
	delete(e.conns, c)
	if e.pending[c.sendTag] == c {
		delete(e.pending, c.sendTag)
	}
	if e.sendTags[c.sendTag] == c {
		delete(e.sendTags, c.sendTag)
		e.tags.release(c.sendTag)
	}
	close(c.done)
}

// acceptedLocked takes an inbound connection out of the endpoint's count of
// those Accept has not taken (see Endpoint.unaccepted): Accept took it, it
// was closed unaccepted, it finished before it was queued, or its reverse
// leg failed to open.
func (c *Conn) acceptedLocked() {
	if c.unaccepted {
		c.unaccepted = false
		c.e.unaccepted--
	}
}

// checkReadyLocked completes a connection whose two legs are up.
func (c *Conn) checkReadyLocked() {
	if c.isReady || !c.sendUp || !c.recvUp || c.awaitFirst || c.err != nil {
		return
	}
	if c.recvLeg.PeerIncarnation != c.peerInc {
		c.failLocked(errIncarnation)
		return
	}
	c.isReady = true
	e := c.e
	if e.pending[c.sendTag] == c {
		delete(e.pending, c.sendTag)
	}
	close(c.ready)
	if c.peerClosed {
		c.answerFINLocked()
	}
	if c.inbound {
		if e.stopped() {
			c.closeUnaccepted() // too late: StopAccepting has run
			return
		}
		c.term = e.acceptStop
		select {
		case e.acceptq <- c:
			c.queued = true
		default:
			c.failLocked(&RejectError{Addr: c.raddr.String(), Reason: RejectBusyRetry})
		}
	}
}
