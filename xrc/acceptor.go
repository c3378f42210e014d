package xrc

import (
	"errors"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/verbs"
	"github.com/goxrc/goxrc/xrc/internal/wire"
)

// downlink is a TGT QP this process receives through: at most one kernel
// handle per process, shared by every leg from that sender through a
// process-local count. The kernel's count of handles across processes is the
// node-wide registration count.
type downlink struct {
	TGTQPN      uint32
	Incarnation uint64     // the sending process's
	INIQPN      uint32     // the sender's INI
	Remote      netip.Addr // the sender's node
	Creator     bool       // this process created the TGT (only it may modify it)
	qp          kernel.QP
	count       int
	// prevs counts the registered legs that moved away from this TGT and
	// may still take messages through it (their prevTGT), until the SRQ
	// drains past mark, the latest such move's. Our handle stays open
	// until then, also at count 0 (see maybeDropLocked).
	prevs int
	mark  uint64
}

// prevTGT is a TGT a leg moved away from, and the SRQ drain count at the
// move: what came through it before the move was in the SRQ then, and is
// taken by the next drain.
type prevTGT struct {
	num  uint32
	mark uint64
	dl   *downlink
}

// acceptedLeg is one accepted one-way leg of a logical connection: a sender's tag
// bound to our tag and a downlink.
type acceptedLeg struct {
	Downlink        *downlink
	PeerIncarnation uint64
	PeerTag         uint32 // the REQ's ConnTag
	Tag             uint32 // ours, in the ACCEPT
	PeerSRQN        uint32 // for the reverse leg
	PeerCredits     uint16 // the sender's receive window, for the reverse leg
	PeerMaxMessage  uint32 // the largest message the sender takes, for the reverse leg
	ReplyPort       uint16
	Reciprocal      uint32 // the forward leg's tag when this is a reverse leg, else 0
	RevTag          uint32 // FlagOneExchange: the sender's receive tag for our reverse leg, else 0
	Physical        bool
	cached          []byte      // VIRT: the ACCEPT, for SIDR retransmissions; under the acceptor's view (AddReverse)
	moveGen         uint32      // the generation of the last MOVE that moved the leg (0: none yet)
	prev            []prevTGT   // TGTs the leg moved away from (newest last, at most 4)
	left            []*downlink // every TGT the leg moved away from that we still hold: no MOVE goes back to one
	used            atomic.Bool // a message came through it: its sender has our ACCEPT
	releasing       atomic.Bool // Release was called: the view no longer counts it (Release)
}

// appReject is what an Admit function returns to refuse a request.
type appReject struct {
	Detail uint32
	App    []byte
}

// acceptorConfig is what an acceptor needs from its process.
type acceptorConfig struct {
	Kernel      kernel.Kernel
	XRCD        kernel.XRCD // the process's handle on the node's domain
	DomainID    uint64      // from the domain file
	Incarnation uint64      // this process's
	SRQN        uint32      // the SRQ senders should name
	Credits     uint16      // the receive window each ACCEPT grants; 0: DefaultRecvWindow
	MaxMessage  uint32      // the largest message our SRQ takes, in each ACCEPT; 0: MaxMessageSize
	// Admit, if set, sees each new request before any kernel object is made
	// or opened; it returns app data for the ACCEPT, or a rejection.
	Admit func(req *wire.Req) ([]byte, *appReject)
	// Drains, if set, counts the times the receive loop emptied the SRQ:
	// a leg takes messages through a TGT it moved away from only until the
	// next one (nil: for as long as it remembers the TGT).
	Drains func() uint64
	// Polls, if set, counts the receive loop's polls begun: a MOVE marks
	// the leg's old TGT with it, and the leg takes messages through that
	// TGT until Drains (the number of the last poll that found the SRQ
	// empty, counted once its batch is delivered) passes the mark.
	Polls func() uint64
	// Kick, if set, ends the receive loop's poll under way: a handle kept
	// for the next drain (maybeDropLocked) must not wait on an idle SRQ.
	Kick func()
}

// acceptor makes the "open new or share existing" decision of
// xrc-protocol.md for one process. It is safe for concurrent use.
type acceptor struct {
	cfg acceptorConfig
	mu  sync.Mutex // held across a decision's kernel calls
	// The endpoint's calls under its own lock that change the state
	// (Release, Unreserve) and the receive loop's Reap do not wait for mu
	// either: runOrLeave leaves them to mu's holder.
	//
	// view is write-locked, under mu, around each change of what
	// LegAccepts reads: legs, byTGT, a leg's Downlink and prev. LegAccepts,
	// on the receive loop for every message, takes only view, so messages
	// keep coming while a decision creates or opens a TGT. So do LegsOn,
	// LegDownlink and LegDownlinks, which the endpoint calls under its own
	// lock (the janitor's linger pass, a connection's failure): waiting
	// for mu there held the endpoint's lock, and every delivery, across a
	// decision's kernel calls. A leg's cached ACCEPT is read and written
	// under view too: AddReverse, which the endpoint calls under its own
	// lock (bindReverseLocked), takes only view (write-locked, not under
	// mu), so it does not wait for a decision's kernel calls either.
	view  sync.RWMutex
	byTGT map[uint32]*downlink
	legs  map[legKey]*acceptedLeg
	// tagMu guards ours, reserved and tags (taken under mu where mu is
	// held, never the other way): ReserveTag, which the endpoint calls
	// under its own lock (openLeg), takes only tagMu, so it does not wait
	// for a decision's kernel calls either.
	tagMu    sync.Mutex
	ours     map[uint32]struct{} // the registered legs' tags (ours), for newTagLocked
	reserved map[uint32]struct{} // tags ReserveTag or accept drew, until registered (setLeg) or Unreserve
	tags     tagSource
	closed   bool // by Close: registers nothing more
	retired  retiredLegs
	// lingering holds the downlinks at count 0 whose handle stays open
	// for messages still queued through them (see maybeDropLocked);
	// nLinger is its size, read by Reap without mu.
	lingering map[*downlink]struct{}
	nLinger   atomic.Int32
	// drainMark is the latest MOVE's mark (prevTGT.mark): until the SRQ
	// drains past it, the receive loop polls with a deadline (Lingering),
	// so that an idle SRQ drains and prevFullLocked forgets the TGT also
	// where it keeps other legs (a count above 0, no handle kept).
	drainMark atomic.Uint64
	// later holds what Release and Reap leave to mu's holder when a
	// decision holds mu across its kernel calls (see runOrLeave); nLater
	// is its length, read without laterMu.
	laterMu sync.Mutex
	later   []func()
	nLater  atomic.Int32
}

// lock takes mu and runs what was left to its holder (runOrLeave): whoever
// takes mu next sees those releases done, as if their callers had waited
// for mu.
func (a *acceptor) lock() {
	a.mu.Lock()
	a.runLaterLocked()
}

// unlock runs what was left to mu's holder, then lets mu go, and runs what
// was left meanwhile, unless mu has another holder (it runs it then).
func (a *acceptor) unlock() {
	a.runLaterLocked()
	a.mu.Unlock()
	a.drainLater()
}

// runOrLeave runs f under mu, at once if mu is free, else leaves it to mu's
// holder, which runs it before it lets mu go (unlock): the endpoint calls
// Release under its own lock, and must not wait there for a decision's
// kernel calls (TestConnEndDuringDecisionDoesNotStallReceive). It reports
// f's error where f ran here, else nil.
func (a *acceptor) runOrLeave(f func() error) error {
	if a.mu.TryLock() {
		a.runLaterLocked() // those left before f, in order
		err := f()
		a.unlock()
		return err
	}
	a.laterMu.Lock()
	a.later = append(a.later, func() { f() })
	a.nLater.Add(1)
	a.laterMu.Unlock()
	// The holder that made TryLock fail may have run the queue before f
	// came: it looks again after it lets mu go (drainLater).
	a.drainLater()
	return nil
}

// drainLater runs what was left while mu is free; where mu has a holder,
// that holder looks again after it lets mu go.
func (a *acceptor) drainLater() {
	for a.nLater.Load() > 0 && a.mu.TryLock() {
		a.runLaterLocked()
		a.mu.Unlock()
	}
}

func (a *acceptor) runLaterLocked() {
	for a.nLater.Load() > 0 {
		a.laterMu.Lock()
		fs := a.later
		a.later = nil
		a.nLater.Add(-int32(len(fs)))
		a.laterMu.Unlock()
		for _, f := range fs {
			f()
		}
	}
}

// retiredLegs remembers the last retiredMax legs that were used and then
// released. Their senders had the ACCEPT, so a request naming one again is a
// SIDR retransmission that arrived late (after the FIN): accepted, it would
// make a leg no sender uses, holding a count until the idle timeout.
type retiredLegs = recent[legKey]

type legKey struct {
	incarnation uint64
	tag         uint32
}

// newAcceptor returns an acceptor for cfg.
func newAcceptor(cfg acceptorConfig) *acceptor {
	if cfg.Credits == 0 {
		cfg.Credits = DefaultRecvWindow
	}
	if cfg.MaxMessage == 0 {
		cfg.MaxMessage = MaxMessageSize
	}
	return &acceptor{cfg: cfg, byTGT: map[uint32]*downlink{}, legs: map[legKey]*acceptedLeg{}, ours: map[uint32]struct{}{},
		reserved: map[uint32]struct{}{}, tags: newTagSource()}
}

// decision is the answer to one CONNECT_REQUEST: Accept with QPNum and
// PrivateData (kernel.Accept), or reject with PrivateData (kernel.Reject).
type decision struct {
	Accept      bool
	QPNum       uint32 // the TGT QPN to accept with
	PrivateData []byte // the encoded ACCEPT or REJECT
	Reject      wire.Reject
	Leg         *acceptedLeg // the leg an ACCEPT created (or, for a duplicate, found)
	Downlink    *downlink    // the downlink Leg is on with this answer (Leg.Downlink changes under the acceptor's lock)
	Duplicate   bool         // a retransmitted VIRT_REQ answered from the cache
	Moved       bool         // a MOVE: an existing leg moved onto another downlink
	stayed      bool         // with Moved: a MOVE onto the downlink the leg is on, which changes nothing
	again       bool         // with Moved: a PHYS_REQ MOVE of the leg's generation, its first copy's REQ once more
	Replaced    *acceptedLeg // released: our answer to an earlier copy of this PHYS_REQ (see physical)
	UnknownMove bool         // a rejected MOVE of a leg we do not hold (see Endpoint.onRequest)
	moveKey     legKey       // with UnknownMove: the leg the MOVE names
	// RefusedDial, on a rejection of a reciprocal request (not a MOVE):
	// the dial of ours it asked the reverse leg of (its peer tag), and
	// refusedInc its sender's incarnation (see Endpoint.reverseRefused).
	RefusedDial uint32
	refusedInc  uint64
	// Aborted: the refused request was an ABORT, its sender's word that
	// the dial's reverse leg will not come (wire.FlagAbort).
	Aborted bool
	// kernelErr, on a BUSY_RETRY for our kernel's failure: that error,
	// the call's name with its errno (the REJECT carries the errno only).
	kernelErr error
}

// Decide answers a CONNECT_REQUEST event from the XRC listener (PHYS_REQ) or
// the SIDR listener (VIRT_REQ). No reference is left behind by a reject. If
// the caller's Accept then fails, it must Release the leg.
func (a *acceptor) Decide(e kernel.Event) decision {
	a.lock()
	defer a.unlock()
	if a.closed { // its endpoint is going: the dialer's retry finds no listener
		return a.reject(0, wire.RejectBusyRetry, 0, nil)
	}
	if !a.cfg.Kernel.XRC() {
		return a.reject(0, wire.RejectNoXRC, 0, nil)
	}
	want := wire.TypePhysReq
	switch e.Exchange {
	case kernel.ExchangeXRC:
	case kernel.ExchangeSIDR:
		want = wire.TypeVirtReq
	default:
		return a.reject(0, wire.RejectBadRequest, 0, nil)
	}
	var req wire.Req
	if err := wire.DecodeReq(e.PrivateData, want, &req); err != nil {
		reason := wire.RejectBadRequest
		var de *wire.DecodeError
		if errors.As(err, &de) {
			reason = de.RejectReason()
		}
		return a.reject(0, reason, 0, nil)
	}
	var d decision
	switch {
	case req.Flags&wire.FlagAbort != 0:
		// It makes nothing: refused, it fails the dial it names.
		d = a.reject(req.ConnTag, wire.RejectBadRequest, 0, nil)
		d.Aborted = true
	case want == wire.TypePhysReq:
		d = a.physical(e, &req)
	default:
		d = a.virtual(e, &req)
	}
	if !d.Accept && req.Flags&(wire.FlagReciprocal|wire.FlagMove) == wire.FlagReciprocal {
		d.RefusedDial, d.refusedInc = req.PeerTag, req.Incarnation
	}
	return d
}

func (a *acceptor) physical(e kernel.Event, req *wire.Req) (d decision) {
	if e.QPNum != req.INIQPN { // the CM's REQ carries the INI QPN too
		return a.reject(req.ConnTag, wire.RejectBadRequest, 0, nil)
	}
	key := legKey{req.Incarnation, req.ConnTag}
	moving := a.legs[key]
	if moving == nil && a.retired.has(key) {
		return a.reject(req.ConnTag, wire.RejectBadRequest, 0, nil)
	}
	if moving != nil && !sameNode(moving.Downlink.Remote, e.Remote.Addr()) {
		return a.foreignLeg(req)
	}
	var replaced *acceptedLeg
	defer func() { d.Replaced = replaced }() // accepted or not
	if req.Flags&wire.FlagMove != 0 {
		// A PHYS_REQ is a fresh CM connection (the CM's stale table
		// refuses a second live one from the same INI), so a MOVE by PHYS
		// needs only the leg. The INI number may equal the old one: the
		// sender's old INI may be destroyed, and its number reused, first.
		if moving == nil {
			return a.unknownMove(req)
		}
		if req.Move < moving.moveGen {
			// A late copy of a MOVE the sender has made again since,
			// or a replay. The same generation is the same MOVE asked
			// again: the sender's CM refused our REP (see below).
			return a.reject(req.ConnTag, wire.RejectBadRequest, 0, nil)
		}
		if a.prevFullLocked(moving) {
			return a.reject(req.ConnTag, wire.RejectBusyRetry, 0, nil)
		}
	} else if moving != nil {
		if !moving.Physical || moving.Downlink.INIQPN != req.INIQPN || !moving.Downlink.Creator {
			return a.reject(req.ConnTag, wire.RejectBadRequest, 0, nil)
		}
		// The same REQ again: the sender's CM rejected our REP (its
		// stale table held our new TGT's number; cm_rep_handler) and
		// sends the REQ once more. Our first answer is void: its leg
		// goes (and its TGT, at count 0), and this one is decided anew.
		a.releaseLocked(moving, true)
		replaced, moving = moving, nil
	}
	var app []byte
	if moving == nil {
		var rej *appReject
		if app, rej = a.admit(req); rej != nil {
			return a.reject(req.ConnTag, wire.RejectApp, rej.Detail, rej.App)
		}
	}
	// A new pair, also for REPLACES_TGT and a new INI from a known
	// incarnation: the old downlink is left to its users' releases (or, for
	// a MOVE, released by the leg moving over).
	k := a.cfg.Kernel
	qp, qpn, err := k.CreateTGT(a.cfg.XRCD)
	if err != nil {
		return a.kernelReject(req.ConnTag, err)
	}
	if err := k.TransitionQP(qp, verbs.QPStateRTS, e.ID); err != nil {
		k.DestroyQP(qp)
		return a.kernelReject(req.ConnTag, err)
	}
	dl := &downlink{TGTQPN: qpn, Incarnation: req.Incarnation, INIQPN: req.INIQPN, Remote: e.Remote.Addr(), Creator: true, qp: qp}
	a.setTGT(dl)
	if moving != nil {
		return a.move(moving, dl, req, true, true)
	}
	return a.accept(dl, req, app, true, true)
}

func (a *acceptor) virtual(e kernel.Event, req *wire.Req) decision {
	key := legKey{req.Incarnation, req.ConnTag}
	moving := a.legs[key]
	from := e.Remote.Addr()
	if l := moving; l != nil {
		if !sameNode(l.Downlink.Remote, from) {
			return a.foreignLeg(req)
		}
		a.view.RLock()
		cached := l.cached // AddReverse may add the reverse leg meanwhile
		a.view.RUnlock()
		if cached != nil && l.moveGen == req.Move &&
			l.Downlink.TGTQPN == req.TGTQPNHint && l.Downlink.INIQPN == req.INIQPN {
			// A SIDR retransmission (or a replay): same answer, no count
			// change.
			return decision{Accept: true, QPNum: l.Downlink.TGTQPN, PrivateData: cached, Leg: l, Downlink: l.Downlink, Duplicate: true}
		}
		if req.Move <= l.moveGen {
			// Not a MOVE, or a late copy of an earlier one, or a
			// replay: a sender numbers each MOVE of a leg past the
			// last, so this one would put the leg back on a TGT it
			// left (until the forty-seventh stop a replay did, where
			// another process kept that TGT alive; found by review).
			return a.reject(req.ConnTag, wire.RejectBadRequest, 0, nil)
		}
		if a.prevFullLocked(l) {
			return a.reject(req.ConnTag, wire.RejectBusyRetry, 0, nil)
		}
	} else if req.Flags&wire.FlagMove != 0 {
		return a.unknownMove(req)
	} else if a.retired.has(key) {
		return a.reject(req.ConnTag, wire.RejectBadRequest, 0, nil)
	}
	if req.DomainHint != a.cfg.DomainID {
		return a.reject(req.ConnTag, wire.RejectDomainMismatch, 0, nil)
	}
	var app []byte
	if moving == nil {
		var rej *appReject
		if app, rej = a.admit(req); rej != nil {
			return a.reject(req.ConnTag, wire.RejectApp, rej.Detail, rej.App)
		}
	}
	if dl := a.byTGT[req.TGTQPNHint]; dl != nil {
		// Our handle is on that number: it is the sender's TGT only if it
		// was made for the same sender incarnation, INI and node.
		if dl.Incarnation != req.Incarnation || dl.INIQPN != req.INIQPN || !sameNode(dl.Remote, from) {
			return a.reject(req.ConnTag, wire.RejectTGTGone, 0, nil)
		}
		if moving != nil {
			if slices.Contains(moving.left, dl) {
				// A TGT the leg has left, still held: whatever its
				// generation says (a replay whose generation was
				// changed), a sender never moves a leg back to a TGT
				// an older INI reached. Not only the TGTs in prev,
				// which forgets them once the SRQ drains: another leg
				// may keep our handle on one long after.
				return a.reject(req.ConnTag, wire.RejectBadRequest, 0, nil)
			}
			return a.move(moving, dl, req, false, false)
		}
		return a.accept(dl, req, app, false, false) // count + 1, no kernel call
	}
	// Register: open by number, then verify, since the number may have been
	// reused by another TGT in our domain.
	k := a.cfg.Kernel
	qp, err := k.OpenTGT(a.cfg.XRCD, req.TGTQPNHint)
	if err != nil {
		return a.reject(req.ConnTag, wire.RejectTGTGone, 0, nil)
	}
	info, err := k.QueryQP(qp)
	if err != nil || info.Type != verbs.QPTypeXRCRecv ||
		(info.State != verbs.QPStateRTR && info.State != verbs.QPStateRTS) ||
		info.DestQPN != req.INIQPN || !sameNode(info.Remote, from) || info.Num != req.TGTQPNHint {
		k.DestroyQP(qp)
		return a.reject(req.ConnTag, wire.RejectTGTGone, 0, nil)
	}
	dl := &downlink{TGTQPN: info.Num, Incarnation: req.Incarnation, INIQPN: req.INIQPN, Remote: from, qp: qp}
	a.setTGT(dl)
	if moving != nil {
		return a.move(moving, dl, req, false, true)
	}
	return a.accept(dl, req, app, false, true)
}

// maxPrev is how many TGTs a leg remembers having left while messages that
// came through them may still be in the SRQ (see prevAcceptsLocked).
const maxPrev = 4

// prevFullLocked forgets the TGTs l left whose messages the SRQ has
// drained since, and reports whether maxPrev remain: a MOVE then waits
// (BUSY_RETRY, which the sender asks again) until the SRQ drains. Moved
// once more, l would forget a TGT whose messages still wait, and drop them
// while their sender took them for delivered (found by review: a stream to
// a slow receiver lost messages when a liar's TGT_GONEs rebuilt the
// uplink five times before its SRQ drained).
func (a *acceptor) prevFullLocked(l *acceptedLeg) bool {
	if len(l.prev) < maxPrev {
		return false
	}
	drained := a.drains()
	var gone []*downlink
	a.view.Lock()
	l.prev = slices.DeleteFunc(l.prev, func(p prevTGT) bool {
		if drained > p.mark {
			p.dl.prevs--
			gone = append(gone, p.dl)
			return true
		}
		return false
	})
	full := len(l.prev) >= maxPrev
	a.view.Unlock()
	for _, dl := range gone {
		a.maybeDropLocked(dl)
	}
	return full
}

// move answers a MOVE: the existing leg l leaves its downlink (unregistering
// it at zero) for dl, keeping its tag, so the receiver's connection is
// unchanged.
func (a *acceptor) move(l *acceptedLeg, dl *downlink, req *wire.Req, physical, fresh bool) decision {
	m := wire.Accept{TagEcho: req.ConnTag, AcceptorTag: l.Tag, Incarnation: a.cfg.Incarnation,
		TGTQPN: dl.TGTQPN, SRQN: a.cfg.SRQN, DomainID: a.cfg.DomainID, Credits: a.cfg.Credits, MaxMessage: a.cfg.MaxMessage}
	buf := make([]byte, wire.BudgetSIDRREP)
	n, err := m.Encode(buf)
	if err != nil {
		if fresh {
			a.drop(dl)
		}
		return a.reject(req.ConnTag, wire.RejectBadRequest, 0, nil)
	}
	old, gen := l.Downlink, l.moveGen
	var forgot *downlink
	a.view.Lock()
	if old != dl {
		mark := a.polls()
		a.drainMark.Store(max(a.drainMark.Load(), mark))
		l.prev = append(l.prev, prevTGT{old.TGTQPN, mark, old})
		old.prevs++
		old.mark = max(old.mark, mark)
		if len(l.prev) > maxPrev { // not after prevFullLocked: a bound all the same
			forgot = l.prev[0].dl
			forgot.prevs--
			l.prev = l.prev[1:]
		}
	}
	l.Downlink = dl
	// The new ACCEPT, in the same write as the downlink: an AddReverse
	// (not under mu) decodes, amends and stores the cache under view, so it
	// amends either the ACCEPT before this MOVE, which this one replaces,
	// or this one, never storing the old over the new.
	l.Physical, l.cached = physical, nil
	if !physical {
		l.cached = buf[:n]
	}
	a.view.Unlock()
	if old != dl {
		// A MOVE onto the link the leg is on changes nothing, so it
		// advances nothing either: taken, a forged one with a huge
		// generation would have every later MOVE of the leg refused.
		l.moveGen = req.Move
	}
	if old != dl { // else a MOVE onto the link the leg is on: nothing to count
		// Only those we still hold: a bound, and one we let go of can
		// never be named again (its number is another QP's).
		l.left = slices.DeleteFunc(l.left, func(x *downlink) bool { return a.byTGT[x.TGTQPN] != x })
		if !slices.Contains(l.left, old) {
			l.left = append(l.left, old)
		}
		dl.count++
		old.count--
		a.maybeDropLocked(old)
		if forgot != nil {
			a.maybeDropLocked(forgot)
		}
		if a.cfg.Kick != nil {
			// The poll under way, begun before the move, may wait for
			// ever on an idle SRQ: the next has a deadline (drainMark).
			// Without it an idle receiver whose legs' old TGTs kept
			// other legs refused their fifth MOVE BUSY_RETRY
			// (TestIdleReceiverTakesMovesPastMaxPrev).
			a.cfg.Kick()
		}
	}
	return decision{Accept: true, QPNum: dl.TGTQPN, PrivateData: buf[:n], Leg: l, Downlink: dl, Moved: true, stayed: old == dl, again: req.Move == gen}
}

func (a *acceptor) admit(req *wire.Req) ([]byte, *appReject) {
	if a.cfg.Admit == nil {
		return nil, nil
	}
	return a.cfg.Admit(req)
}

// accept encodes the ACCEPT and counts the leg on dl (fresh: dl was just
// created or opened, and is dropped again if the ACCEPT cannot be made).
func (a *acceptor) accept(dl *downlink, req *wire.Req, app []byte, physical, fresh bool) decision {
	// Reserved until setLeg registers it: ReserveTag, not under mu,
	// draws no tag meanwhile that this leg takes.
	a.tagMu.Lock()
	tag := a.newTagLocked()
	a.reserved[tag] = struct{}{}
	a.tagMu.Unlock()
	m := wire.Accept{TagEcho: req.ConnTag, AcceptorTag: tag, Incarnation: a.cfg.Incarnation,
		TGTQPN: dl.TGTQPN, SRQN: a.cfg.SRQN, DomainID: a.cfg.DomainID, Credits: a.cfg.Credits, MaxMessage: a.cfg.MaxMessage}
	buf := make([]byte, wire.BudgetSIDRREP)
	var n int
	err := m.SetApp(app)
	if err == nil {
		n, err = m.Encode(buf)
	}
	if err != nil { // the app's data does not fit: undo, refuse
		a.tagMu.Lock()
		delete(a.reserved, tag) // never sent: free at once
		a.tagMu.Unlock()
		if fresh {
			a.drop(dl)
		}
		return a.reject(req.ConnTag, wire.RejectApp, 0, nil)
	}
	dl.count++
	l := &acceptedLeg{Downlink: dl, PeerIncarnation: req.Incarnation, PeerTag: req.ConnTag, Tag: m.AcceptorTag,
		PeerSRQN: req.SRQN, PeerCredits: req.Credits, PeerMaxMessage: req.MaxMessage, ReplyPort: req.ReplyPort, Physical: physical}
	if req.Flags&wire.FlagReciprocal != 0 {
		l.Reciprocal = req.PeerTag
	} else if req.Flags&wire.FlagOneExchange != 0 {
		l.RevTag = req.PeerTag
	}
	if !physical {
		l.cached = buf[:n]
	}
	a.setLeg(legKey{req.Incarnation, req.ConnTag}, l)
	return decision{Accept: true, QPNum: dl.TGTQPN, PrivateData: buf[:n], Leg: l, Downlink: dl}
}

// ReserveTag returns a fresh tag of ours for a leg not registered yet (the
// reverse leg a FlagOneExchange VIRT_REQ announces); ReverseLeg registers
// it, or Unreserve gives it back.
func (a *acceptor) ReserveTag() uint32 {
	a.tagMu.Lock()
	defer a.tagMu.Unlock()
	t := a.newTagLocked()
	a.reserved[t] = struct{}{}
	return t
}

// Unreserve gives back a tag of ReserveTag's that will not be registered.
// The endpoint calls it under its lock (a connection's end): it does not
// wait for a decision's kernel calls (it takes only tagMu).
func (a *acceptor) Unreserve(t uint32) {
	a.tagMu.Lock()
	defer a.tagMu.Unlock()
	if _, ok := a.reserved[t]; ok {
		delete(a.reserved, t)
		a.tags.release(t)
	}
}

// newTagLocked returns a tag no registered or reserved leg has (a second
// leg with a live leg's tag would take its messages), nor one released
// lately (a message still queued for it would be taken): see tagSource.
// Under tagMu.
func (a *acceptor) newTagLocked() uint32 {
	return a.tags.next(func(t uint32) bool {
		_, used := a.ours[t]
		_, reserved := a.reserved[t]
		return used || reserved
	})
}

// AddReverse puts rev into the cached ACCEPT of the VIRT leg l (just
// accepted, FlagOneExchange) and returns the new encoding, which also
// answers the request's retransmissions. It fails (and l's ACCEPT stays as
// it was) if the leg is gone or the section does not fit with the app data.
// The endpoint calls it under its lock (bindReverseLocked): it takes only
// view, not mu, and so does not wait for a decision's kernel calls. The
// whole decode, amend and store is under view's write lock: a MOVE of l
// (which writes l.cached under it) comes wholly before or after, and a
// release (deleteLeg) cannot come between the check and the store.
func (a *acceptor) AddReverse(l *acceptedLeg, rev wire.Reverse) ([]byte, bool) {
	a.view.Lock()
	defer a.view.Unlock()
	// A Release left to mu's holder (runOrLeave) has not deleted the leg
	// yet, but marked it: gone, as for LegAccepts.
	if a.legs[legKey{l.PeerIncarnation, l.PeerTag}] != l || l.releasing.Load() || l.cached == nil || l.RevTag == 0 {
		return nil, false
	}
	var m wire.Accept
	if wire.DecodeAccept(l.cached, &m) != nil {
		return nil, false
	}
	m.Flags, m.Rev = wire.AcceptReverse, rev
	buf := make([]byte, wire.BudgetSIDRREP)
	n, err := m.Encode(buf)
	if err != nil {
		return nil, false
	}
	l.cached = buf[:n]
	return l.cached, true
}

// ReverseLeg registers, on the requester's side, the reverse leg an ACCEPT
// flagged AcceptReverse announced, as the acceptor would for a VIRT_REQ:
// tag is the one we reserved (ReserveTag) and sent in the REQ, from the
// node the ACCEPT came from, acc the decoded ACCEPT. We share our handle
// on the TGT if we hold one for the same sender incarnation, INI and node
// (count + 1), or open it by number and verify it (XRC_RECV, RTR/RTS, dest
// QPN = the acceptor's INI, remote address = its node); anything else
// leaves no handle, count or leg and returns an error: errReverseGone or
// errReverseDomain where an honest acceptor may have named it (Dial asks
// again by two exchanges), else errBadReverse.
func (a *acceptor) ReverseLeg(tag uint32, fwdTag uint32, acc *wire.Accept, from netip.Addr, replyPort uint16) (*acceptedLeg, error) {
	a.lock()
	defer a.unlock()
	if a.closed {
		// A dial's reverse leg racing the endpoint's Close: a TGT opened
		// now would outlive the domain's close.
		return nil, ErrClosed
	}
	rev := acc.Rev
	if acc.Flags&wire.AcceptReverse == 0 {
		return nil, errBadReverse
	}
	key := legKey{acc.Incarnation, rev.Tag}
	if a.legs[key] != nil {
		return nil, errBadReverse
	}
	a.tagMu.Lock()
	_, used := a.ours[tag]
	a.tagMu.Unlock()
	if used {
		return nil, errBadReverse
	}
	if rev.DomainID != a.cfg.DomainID {
		// A reverse leg into another domain is what a hostile peer names,
		// but also an honest one that learned our address's domain from
		// a process here before us, in another domain (see Endpoint.Dial).
		return nil, errReverseDomain
	}
	// A TGT that is not the peer's (none by that number, or another
	// sender's, or ours for another INI) is what a hostile peer names,
	// but also an honest one whose TGT here went, its number perhaps
	// taken again, while its uplink was still up (see Endpoint.Dial).
	dl := a.byTGT[rev.TGTQPN]
	if dl != nil {
		if dl.Incarnation != acc.Incarnation || dl.INIQPN != rev.INIQPN || !sameNode(dl.Remote, from) {
			return nil, errReverseGone
		}
	} else {
		k := a.cfg.Kernel
		qp, err := k.OpenTGT(a.cfg.XRCD, rev.TGTQPN)
		if err != nil {
			return nil, errReverseGone
		}
		info, err := k.QueryQP(qp)
		if err != nil || info.Type != verbs.QPTypeXRCRecv ||
			(info.State != verbs.QPStateRTR && info.State != verbs.QPStateRTS) ||
			info.DestQPN != rev.INIQPN || !sameNode(info.Remote, from) || info.Num != rev.TGTQPN {
			k.DestroyQP(qp)
			return nil, errReverseGone
		}
		dl = &downlink{TGTQPN: info.Num, Incarnation: acc.Incarnation, INIQPN: rev.INIQPN, Remote: from, qp: qp}
		a.setTGT(dl)
	}
	dl.count++
	l := &acceptedLeg{Downlink: dl, PeerIncarnation: acc.Incarnation, PeerTag: rev.Tag, Tag: tag, PeerSRQN: acc.SRQN,
		ReplyPort: replyPort, Reciprocal: fwdTag}
	a.setLeg(key, l) // and no longer reserved
	return l, nil
}

func (a *acceptor) drop(dl *downlink) {
	a.deleteTGT(dl)
	a.cfg.Kernel.DestroyQP(dl.qp)
}

// setLeg, deleteLeg, setTGT and deleteTGT change the maps under mu and view.
func (a *acceptor) setLeg(k legKey, l *acceptedLeg) {
	a.view.Lock()
	a.legs[k] = l
	a.view.Unlock()
	a.tagMu.Lock()
	a.ours[l.Tag] = struct{}{}
	delete(a.reserved, l.Tag) // registered now
	a.tagMu.Unlock()
}

// deleteLeg forgets the leg k; sent: its ACCEPT went out, so messages for
// its tag may still come, and the tag is kept from reuse (tagSource.release).
func (a *acceptor) deleteLeg(k legKey, sent bool) {
	a.view.Lock()
	l := a.legs[k]
	delete(a.legs, k)
	a.view.Unlock()
	if l != nil {
		a.tagMu.Lock()
		delete(a.ours, l.Tag)
		if sent {
			a.tags.release(l.Tag)
		}
		a.tagMu.Unlock()
	}
}

func (a *acceptor) setTGT(dl *downlink) {
	a.view.Lock()
	a.byTGT[dl.TGTQPN] = dl
	a.view.Unlock()
}

// deleteTGT forgets dl if it still holds its number.
func (a *acceptor) deleteTGT(dl *downlink) {
	a.view.Lock()
	if a.byTGT[dl.TGTQPN] == dl {
		delete(a.byTGT, dl.TGTQPN)
	}
	a.view.Unlock()
}

// unknownMove refuses a MOVE of a leg we do not hold.
// foreignLeg refuses a request naming a leg we hold (its sender's
// incarnation and tag) from another node than the leg's. A leg never
// changes node (a sender recovers its legs over its uplink to the same
// node). Taken for the leg, a
// MOVE would put the leg on the requester's TGT, whose messages would then
// reach the connection as the sender's, and a repeated PHYS_REQ would
// release the leg and fail its connection.
func (a *acceptor) foreignLeg(req *wire.Req) decision {
	return a.reject(req.ConnTag, wire.RejectBadRequest, 0, nil)
}

// unknownMove answers a MOVE of a leg we do not hold.
func (a *acceptor) unknownMove(req *wire.Req) decision {
	d := a.reject(req.ConnTag, wire.RejectBadRequest, 0, nil)
	d.UnknownMove, d.moveKey = true, legKey{req.Incarnation, req.ConnTag}
	return d
}

// Holds reports whether the leg k is registered.
func (a *acceptor) Holds(k legKey) bool {
	a.lock()
	defer a.unlock()
	return a.legs[k] != nil
}

func (a *acceptor) reject(tag uint32, reason wire.RejectReason, detail uint32, app []byte) decision {
	r := wire.Reject{Tag: tag, Reason: reason, MinVersion: wire.MinVersion, MaxVersion: wire.MaxVersion,
		Detail: detail, DomainID: a.cfg.DomainID}
	if r.SetApp(app) != nil {
		r.SetApp(nil)
	}
	buf := make([]byte, wire.BudgetSIDRREP)
	n, err := r.Encode(buf)
	if err != nil { // only DOMAIN_MISMATCH without a domain id can fail
		r.Reason = wire.RejectNoXRC
		n, _ = r.Encode(buf)
	}
	return decision{PrivateData: buf[:n], Reject: r}
}

// kernelReject refuses a request BUSY_RETRY for our kernel's failure err,
// its errno the REJECT's detail.
func (a *acceptor) kernelReject(tag uint32, err error) decision {
	d := a.reject(tag, wire.RejectBusyRetry, errnoOf(err), nil)
	d.kernelErr = err
	return d
}

// Release ends a leg (after its FIN, or when the sender is gone): the local
// count drops, and at zero the process's kernel handle is destroyed (the
// unregister); the TGT dies with the node's last handle.
//
// It never waits for a decision's kernel calls: where one holds the lock,
// the leg is marked releasing at once (LegsOn, LegDownlinks and LegAccepts
// no longer count it) and the decision releases it before it lets go
// (runOrLeave); nil is returned then.
func (a *acceptor) Release(l *acceptedLeg) error {
	l.releasing.Store(true)
	return a.runOrLeave(func() error { return a.releaseLocked(l, true) })
}

// Withdraw releases a leg whose ACCEPT never went out (the endpoint refused
// its request after Decide). Nothing can come for its tag, which is not
// kept from reuse: retiredMax such refusals (a hostile peer's, or a burst
// of BUSY_RETRYs) pushed the tags of legs just released, whose messages may
// still be queued, out of that memory.
func (a *acceptor) Withdraw(l *acceptedLeg) error {
	a.lock()
	defer a.unlock()
	return a.releaseLocked(l, false)
}

func (a *acceptor) releaseLocked(l *acceptedLeg, sent bool) error {
	key := legKey{l.PeerIncarnation, l.PeerTag}
	if a.legs[key] != l {
		return nil // already released
	}
	a.deleteLeg(key, sent)
	if l.used.Load() {
		a.retired.add(key)
	}
	for _, p := range l.prev {
		p.dl.prevs--
		a.maybeDropLocked(p.dl)
	}
	dl := l.Downlink
	dl.count--
	return a.maybeDropLocked(dl)
}

// maybeDropLocked destroys our handle on dl once no leg receives through it
// (count 0) and none that moved away from it may still take a message
// through it: until the SRQ drains past the latest such move, the handle
// stays open, and with it the TGT, whose number the kernel would otherwise
// give at once to the next TGT made on the node. A leg then refuses what
// comes through the number it left when we hold the new TGT for another
// sender (prevAcceptsLocked), and would drop messages its sender had sent
// through the old TGT, completed (never to be sent again) and still queued
// in the SRQ. Reap, after each drain, destroys the handles kept.
func (a *acceptor) maybeDropLocked(dl *downlink) error {
	if dl.count > 0 || dl.prevs > 0 && a.cfg.Drains != nil && a.drains() <= dl.mark && !a.closed {
		_, kept := a.lingering[dl]
		if dl.count == 0 && !kept {
			if a.lingering == nil {
				a.lingering = map[*downlink]struct{}{}
			}
			a.lingering[dl] = struct{}{}
			a.nLinger.Add(1)
			if a.cfg.Kick != nil {
				a.cfg.Kick()
			}
		} else if dl.count > 0 && kept { // shared again meanwhile
			delete(a.lingering, dl)
			a.nLinger.Add(-1)
		}
		return nil
	}
	if _, kept := a.lingering[dl]; kept {
		delete(a.lingering, dl)
		a.nLinger.Add(-1)
	}
	if a.byTGT[dl.TGTQPN] != dl {
		return nil // destroyed already
	}
	a.deleteTGT(dl)
	return a.cfg.Kernel.DestroyQP(dl.qp)
}

// Lingering reports whether maybeDropLocked keeps a handle for the next
// drain, or a leg's MOVE since the last drain waits for one (drainMark).
func (a *acceptor) Lingering() bool {
	if a.nLinger.Load() > 0 {
		return true
	}
	m := a.drainMark.Load()
	return m > 0 && a.cfg.Drains != nil && a.drains() <= m
}

// Reap destroys the handles maybeDropLocked kept that no message can need
// any more; the receive loop calls it after each drain.
func (a *acceptor) Reap() {
	if a.nLinger.Load() == 0 {
		return
	}
	// The receive loop calls it: it must not wait for a decision's kernel
	// calls, whose holder reaps before it lets go (runOrLeave).
	a.runOrLeave(func() error {
		for dl := range a.lingering {
			a.maybeDropLocked(dl)
		}
		return nil
	})
}

// LegTGT is the TGT number the leg currently receives through (a MOVE
// changes it), and whether the leg is still registered.
func (a *acceptor) LegTGT(l *acceptedLeg) (uint32, bool) {
	a.lock()
	defer a.unlock()
	if a.legs[legKey{l.PeerIncarnation, l.PeerTag}] != l {
		return 0, false
	}
	return l.Downlink.TGTQPN, true
}

// LegDownlink is the downlink the leg currently receives through (a MOVE
// changes it).
func (a *acceptor) LegDownlink(l *acceptedLeg) *downlink {
	a.view.RLock()
	defer a.view.RUnlock()
	return l.Downlink
}

// LegAccepts reports whether a message that came through the TGT numbered
// qpn may belong to the leg: the leg is registered and receives through that
// TGT, or did before a MOVE (messages queued before the move). Such a
// message marks the leg used: once released, its key is retired.
func (a *acceptor) LegAccepts(l *acceptedLeg, qpn uint32) bool {
	a.view.RLock()
	defer a.view.RUnlock()
	if a.legs[legKey{l.PeerIncarnation, l.PeerTag}] != l || l.releasing.Load() {
		return false
	}
	ok := l.Downlink.TGTQPN == qpn || a.prevAcceptsLocked(l, qpn)
	if ok && !l.used.Load() {
		l.used.Store(true)
	}
	return ok
}

// prevAcceptsLocked reports whether qpn is a TGT l moved away from whose
// messages may still be in the SRQ. Not once the SRQ was drained after the
// move (acked messages were in the SRQ before the sender's recovery began,
// and the rest it sends again), nor where we hold a TGT of that number for
// another sender: a freed number is reused at once, and another sender's
// message naming this leg's tag through it must not be taken.
func (a *acceptor) prevAcceptsLocked(l *acceptedLeg, qpn uint32) bool {
	for _, p := range l.prev {
		if p.num != qpn || a.drains() > p.mark {
			continue
		}
		if dl := a.byTGT[qpn]; dl != nil && (dl.Incarnation != l.PeerIncarnation || !sameNode(dl.Remote, l.Downlink.Remote)) {
			return false
		}
		return true
	}
	return false
}

func (a *acceptor) polls() uint64 {
	if a.cfg.Polls == nil {
		return 0
	}
	return a.cfg.Polls()
}

func (a *acceptor) drains() uint64 {
	if a.cfg.Drains == nil {
		return 0
	}
	return a.cfg.Drains()
}

// Close destroys every handle the acceptor holds and forgets every leg.
func (a *acceptor) Close() {
	a.lock()
	defer a.unlock()
	a.closed = true
	for _, dl := range a.byTGT {
		a.cfg.Kernel.DestroyQP(dl.qp)
	}
	a.view.Lock()
	clear(a.byTGT)
	clear(a.legs)
	a.view.Unlock()
	clear(a.lingering)
	a.nLinger.Store(0)
	a.tagMu.Lock()
	clear(a.ours)
	a.tagMu.Unlock()
	a.retired = retiredLegs{}
}

// LegsOn returns the registered legs that receive through dl (what a DREQ
// on the physical link that made dl ends). It matches the downlink, not its
// numbers: once dl is gone, a TGT with its number may be another sender's,
// from an INI with the same number on another node (QP numbers are per
// device), and a DREQ on dl's old link must not end that sender's legs.
func (a *acceptor) LegsOn(dl *downlink) []*acceptedLeg {
	a.view.RLock()
	defer a.view.RUnlock()
	var out []*acceptedLeg
	for _, l := range a.legs {
		if onLink(l.Downlink, dl) && !l.releasing.Load() {
			out = append(out, l)
		}
	}
	return out
}

// LegDownlinks returns the downlinks that registered legs receive through.
func (a *acceptor) LegDownlinks() map[*downlink]struct{} {
	a.view.RLock()
	defer a.view.RUnlock()
	out := make(map[*downlink]struct{}, len(a.legs))
	for _, l := range a.legs {
		if !l.releasing.Load() {
			out[l.Downlink] = struct{}{}
		}
	}
	return out
}

// linkNumbers is what onLink matches a TGT opened again by number on.
type linkNumbers struct {
	tgt, ini    uint32
	incarnation uint64
}

// linksInUse reports, for each of links (downlinks that physical links
// made), whether a downlink in held is on it (onLink), in one pass over
// each: the janitor asks under the endpoint's lock, where a pass over held
// per link grows with links times senders (a review).
func linksInUse(links []*downlink, held map[*downlink]struct{}) []bool {
	reopened := map[linkNumbers][]*downlink{}
	for o := range held {
		if !o.Creator {
			k := linkNumbers{o.TGTQPN, o.INIQPN, o.Incarnation}
			reopened[k] = append(reopened[k], o)
		}
	}
	out := make([]bool, len(links))
	for i, dl := range links {
		if _, ok := held[dl]; ok {
			out[i] = true
			continue
		}
		out[i] = slices.ContainsFunc(reopened[linkNumbers{dl.TGTQPN, dl.INIQPN, dl.Incarnation}],
			func(o *downlink) bool { return onLink(o, dl) })
	}
	return out
}

// onLink reports whether downlink o belongs to the physical link that made
// dl: it is dl, or the same TGT opened again by number after our handle on
// it went (another process of the node kept it): same sender incarnation,
// INI and node, and not a TGT a link of ours made.
func onLink(o, dl *downlink) bool {
	return o == dl || !o.Creator && o.TGTQPN == dl.TGTQPN && o.INIQPN == dl.INIQPN &&
		o.Incarnation == dl.Incarnation && sameNode(o.Remote, dl.Remote)
}

// LocalCounts is the sum of this process's use counts over its TGT handles
// (the number of registered legs).
func (a *acceptor) LocalCounts() int {
	a.lock()
	defer a.unlock()
	return len(a.legs)
}

// LocalCount is this process's use count of the TGT numbered qpn (0 if it
// holds no handle on it).
func (a *acceptor) LocalCount(qpn uint32) int {
	a.lock()
	defer a.unlock()
	if dl := a.byTGT[qpn]; dl != nil {
		return dl.count
	}
	return 0
}

// Downlinks is the number of TGT handles this process holds.
func (a *acceptor) Downlinks() int {
	a.lock()
	defer a.unlock()
	return len(a.byTGT)
}

// errnoOf is the errno behind a kernel error, as a REJECT detail.
func errnoOf(err error) uint32 {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return uint32(errno)
	}
	return 0
}
