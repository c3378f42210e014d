package model

import (
	"context"
	"net/netip"
	"slices"
	"syscall"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/verbs"
)

// Private-data budgets of the CM messages (IP addressing).
const (
	budgetREQ     = 56
	budgetREP     = 196
	budgetREJ     = 148
	budgetSIDRREQ = 180
	budgetSIDRREP = 136
)

type portSpace uint8

const (
	psTCP portSpace = iota + 1
	psUDP
	psIB
)

func spaceOf(ex kernel.Exchange) portSpace {
	switch ex {
	case kernel.ExchangeSIDR:
		return psUDP
	case kernel.ExchangeRC:
		return psTCP
	}
	return psIB
}

type listenKey struct {
	ps   portSpace
	port uint16
}

// staleKey is how ib_cm keys live connections: remote CA (node) and remote QPN.
type staleKey struct {
	node *Node
	qpn  uint32
}

type cmState uint8

const (
	csIdle        cmState = iota // fresh, or done (rejected, answered SIDR, ...)
	csListen                     // listening
	csReqSent                    // active: REQ out
	csReqRcvd                    // passive: CONNECT_REQUEST delivered, not answered
	csRepSent                    // passive: accepted, waiting for RTU
	csRepRcvd                    // active: CONNECT_RESPONSE delivered, not established
	csEstablished                // connected
	csDreqSent                   // we sent a DREQ, waiting for the DREP
	csDreqRcvd                   // DISCONNECTED delivered, our DREP not sent
	csTimewait                   // disconnected both ways
	csSIDRReqSent                // active SIDR: waiting for the SIDR REP
	csSIDRReqRcvd                // passive SIDR: CONNECT_REQUEST delivered
)

// cmid is an RDMA CM id.
type cmid struct {
	h         kernel.ID
	p         *Process
	ex        kernel.Exchange
	tgtTyped  bool // XRC_RECV-typed (an XRC listener's ids): destroy sends no DREQ
	state     cmState
	local     netip.AddrPort
	remote    netip.AddrPort
	localQPN  uint32
	remoteQPN uint32
	peer      *cmid    // the other end of the exchange, nil once it is gone
	reqPD     []byte   // active: the REQ, for the kernel's retransmission
	staleIn   *Node    // the node whose stale table holds us
	staleAt   staleKey // and under which key
	dead      bool
	events    queue[kernel.Event]
}

func (id *cmid) node() *Node { return id.p.n }

// reaches reports whether what id sends gets to peer: not from or to a node
// that is off (PowerOff, FailDevice). cut drops peer's tie to id too, where
// it does not: peer hears nothing and goes on as it was, until its own
// timeout (or, for a DREQ of its own, the DREQ's at once).
func (id *cmid) reaches(peer *cmid) bool {
	return !id.node().off && !peer.node().off
}

// sendFails is the error of a CM message's post on a failed device:
// mlx5's post_send fails every send there (the GSI QP's too) with EIO, so
// ib_send_cm_rep, _rtu, _rej and _req fail at the sender, before any state
// changes, and their rdma_cm calls return it.
func (id *cmid) sendFails(op string) error { return id.p.deviceErr(op) }

func (id *cmid) cut(peer *cmid) {
	if peer.peer == id {
		peer.peer = nil
	}
	id.peer = nil
}

func (id *cmid) post(e kernel.Event) {
	if id.dead {
		return
	}
	if e.ID == 0 {
		e.ID = id.h
	}
	if e.Exchange == 0 {
		e.Exchange = id.ex
	}
	if !e.Remote.IsValid() {
		e.Remote = id.remote
	}
	id.events.push(e)
}

// pad returns pd as the kernel delivers it: always n bytes, zero-padded.
func pad(pd []byte, n int) []byte {
	b := make([]byte, n)
	copy(b, pd)
	return b
}

func (id *cmid) enterStale(in *Node, k staleKey) {
	id.staleIn, id.staleAt = in, k
	in.stale[k] = id
}

func (id *cmid) leaveStale() {
	if id.staleIn != nil && id.staleIn.stale[id.staleAt] == id {
		delete(id.staleIn.stale, id.staleAt)
	}
	id.staleIn = nil
}

func (p *Process) newID(ex kernel.Exchange) *cmid {
	id := &cmid{p: p, ex: ex, events: newQueue[kernel.Event]()}
	id.h = kernel.ID(p.add(id))
	return id
}

func (n *Node) port() uint16 {
	n.nextPort++
	if n.nextPort == 0 {
		n.nextPort = ephemeral
	}
	return n.nextPort
}

func validExchange(ex kernel.Exchange) bool {
	return ex >= kernel.ExchangeXRC && ex <= kernel.ExchangeIBRC
}

func (p *Process) Listen(addr netip.AddrPort, ex kernel.Exchange) (kernel.ID, error) {
	const op = "rdma_listen"
	p.lock()
	defer p.unlock()
	if p.closed {
		return 0, &verbs.OpError{Op: op, Err: verbs.ErrClosed}
	}
	if !validExchange(ex) || (addr.Addr().IsValid() && !addr.Addr().IsUnspecified() && addr.Addr() != p.n.addr) {
		return 0, opErr("rdma_bind_addr", syscall.EADDRNOTAVAIL)
	}
	port := addr.Port()
	if port == 0 {
		port = p.n.port()
	}
	k := listenKey{spaceOf(ex), port}
	if p.n.listeners[k] != nil {
		return 0, opErr("rdma_bind_addr", syscall.EADDRINUSE)
	}
	id := p.newID(ex)
	id.state = csListen
	id.tgtTyped = ex == kernel.ExchangeXRC
	id.local = netip.AddrPortFrom(p.n.addr, port)
	p.n.listeners[k] = id
	return id.h, nil
}

func (p *Process) Connect(ctx context.Context, dst netip.AddrPort, ex kernel.Exchange, qpNum uint32, pd []byte) (kernel.ID, error) {
	const op = "rdma_connect"
	if err := ctx.Err(); err != nil {
		return 0, &verbs.OpError{Op: op, Addr: dst.String(), Err: err}
	}
	p.lock()
	defer p.unlock()
	if p.closed {
		return 0, &verbs.OpError{Op: op, Err: verbs.ErrClosed}
	}
	if !validExchange(ex) {
		return 0, opErr(op, syscall.EINVAL)
	}
	budget := budgetREQ
	if ex == kernel.ExchangeSIDR {
		budget = budgetSIDRREQ
	}
	if len(pd) > budget {
		return 0, &verbs.OpError{Op: op, Addr: dst.String(), Err: syscall.EINVAL}
	}
	// A node has one address: like a host with none of the other family,
	// it has no route to a node of that family.
	if n := p.n.f.nodeAt(dst.Addr()); n == nil || nodeKey(n.addr).Is4() != nodeKey(p.n.addr).Is4() {
		return 0, &verbs.OpError{Op: "rdma_resolve_addr", Addr: dst.String(), Err: syscall.EHOSTUNREACH}
	}
	if p.n.failed {
		return 0, &verbs.OpError{Op: op, Addr: dst.String(), Err: syscall.EIO} // see sendFails
	}
	id := p.newID(ex)
	id.local = netip.AddrPortFrom(p.n.addr, p.n.port())
	id.remote = dst
	id.localQPN = qpNum & 0xFFFFFF // the CM carries 24 bits
	id.reqPD = slices.Clone(pd)
	if ex == kernel.ExchangeSIDR {
		p.n.f.sidrReq(id)
	} else {
		p.n.f.req(id)
	}
	return id.h, nil
}

// sidrReq delivers a SIDR REQ. SIDR never touches the stale table.
func (f *Fabric) sidrReq(a *cmid) {
	dst := f.nodeAt(a.remote.Addr())
	if dst.off || a.node().off {
		a.state = csSIDRReqSent // no answer comes (PowerOff)
		return
	}
	l := dst.listeners[listenKey{psUDP, a.remote.Port()}]
	if l == nil {
		a.state = csIdle
		a.post(kernel.Event{Type: kernel.EventUnreachable, Status: kernel.SIDRNoListener, PrivateData: pad(nil, budgetSIDRREP)})
		return
	}
	s := l.p.newID(kernel.ExchangeSIDR)
	s.state = csSIDRReqRcvd
	s.local, s.remote, s.peer = l.local, a.local, a
	a.peer, a.state = s, csSIDRReqSent
	// A SIDR REQ carries no QPN.
	l.post(kernel.Event{Type: kernel.EventConnectRequest, ID: s.h, Remote: a.local, PrivateData: pad(a.reqPD, budgetSIDRREQ)})
}

// req delivers a connected-mode REQ from the active id a.
func (f *Fabric) req(a *cmid) {
	dst := f.nodeAt(a.remote.Addr())
	if dst.off || a.node().off {
		a.state = csReqSent // no answer comes (PowerOff)
		return
	}
	a.state = csIdle
	// cm_match_req: a connection from the same (node, QPN) in the table
	// makes this REQ stale: REJ(10) to the new one, whatever port it names
	// (the check comes before the listener lookup), and a DREQ to the old
	// one, which ib_send_cm_dreq sends only if it is established (a pending
	// one stays as it was). Nothing to the listener.
	k := staleKey{a.node(), a.localQPN}
	if old := dst.stale[k]; old != nil {
		a.post(kernel.Event{Type: kernel.EventRejected, Status: kernel.RejStaleConn, PrivateData: pad(nil, budgetREJ)})
		if old.state == csEstablished {
			old.sendDREQ()
		}
		return
	}
	l := dst.listeners[listenKey{spaceOf(a.ex), a.remote.Port()}]
	if l == nil {
		a.post(kernel.Event{Type: kernel.EventRejected, Status: kernel.RejInvalidServiceID, PrivateData: pad(nil, budgetREJ)})
		return
	}
	// cma_check_req_qp_type: an XRC REQ matches only an XRC listener and an
	// RC one only an RC listener; the listener never sees a mismatch.
	if (a.ex == kernel.ExchangeXRC) != (l.ex == kernel.ExchangeXRC) {
		a.post(kernel.Event{Type: kernel.EventRejected, Status: kernel.RejConsumerDefined, PrivateData: pad(nil, budgetREJ)})
		return
	}
	s := l.p.newID(a.ex)
	s.tgtTyped = l.tgtTyped
	s.state = csReqRcvd
	s.local, s.remote = l.local, a.local
	s.remoteQPN = a.localQPN
	s.peer, a.peer = a, s
	a.state = csReqSent
	s.enterStale(dst, k)
	l.post(kernel.Event{Type: kernel.EventConnectRequest, ID: s.h, Remote: a.local, QPNum: a.localQPN, PrivateData: pad(a.reqPD, budgetREQ)})
}

// rep delivers the passive id s's REP to its active peer.
func (f *Fabric) rep(s *cmid, pd []byte) {
	a := s.peer
	if a == nil || a.state != csReqSent {
		return
	}
	if !s.reaches(a) {
		s.leaveStale()
		s.cut(a)
		return
	}
	an := a.node()
	k := staleKey{s.node(), s.localQPN}
	if old := an.stale[k]; old != nil {
		// cm_rep_handler: the REP's QPN is live here. The new passive id is
		// rejected, the old connection gets a DREQ from its id on this node
		// if it is established, the active id sees nothing and its REQ is
		// retransmitted (after ~6 s on rxe; at once here). The old entry
		// stays until the DREP, so a REP naming the same number again is
		// stale again until the old connection's peer has answered.
		s.leaveStale()
		s.peer, a.peer = nil, nil
		s.state = csIdle
		s.post(kernel.Event{Type: kernel.EventRejected, Status: kernel.RejStaleConn, PrivateData: pad(nil, budgetREJ)})
		if old.state == csEstablished {
			old.sendDREQ()
		}
		f.req(a)
		return
	}
	a.remoteQPN = s.localQPN
	a.state = csRepRcvd
	a.enterStale(an, k)
	a.post(kernel.Event{Type: kernel.EventConnectResponse, QPNum: s.localQPN, PrivateData: pad(pd, budgetREP)})
}

func (p *Process) Accept(h kernel.ID, qpNum uint32, pd []byte) error {
	const op = "rdma_accept"
	p.lock()
	defer p.unlock()
	id, err := lookup[*cmid](p, op, uint64(h))
	if err != nil {
		return err
	}
	switch id.state {
	case csSIDRReqRcvd:
		if len(pd) > budgetSIDRREP {
			id.rejectPeer(nil) // a failed accept rejects the peer
			return opErr(op, syscall.EINVAL)
		}
		if err := id.sendFails(op); err != nil {
			return err
		}
		id.state = csIdle
		if a := id.peer; a != nil && !id.reaches(a) {
			id.cut(a)
		} else if a != nil && a.state == csSIDRReqSent {
			a.state, a.peer, id.peer = csIdle, nil, nil
			a.remoteQPN = qpNum & 0xFFFFFF
			a.post(kernel.Event{Type: kernel.EventEstablished, QPNum: a.remoteQPN, QKey: kernel.SIDRQKey, PrivateData: pad(pd, budgetSIDRREP)})
		}
		return nil
	case csReqRcvd:
		if len(pd) > budgetREP {
			id.rejectPeer(nil)
			return opErr(op, syscall.EINVAL)
		}
		if err := id.sendFails(op); err != nil {
			return err
		}
		id.localQPN = qpNum & 0xFFFFFF
		id.state = csRepSent
		p.n.f.rep(id, pd)
		return nil
	case csRepSent, csRepRcvd:
		// rdma_accept passes its own state check, ib_send_cm_rep
		// fails, and the failure path rejects the peer.
		id.rejectPeer(nil)
	}
	return opErr(op, syscall.EINVAL)
}

// rejectREQ is the REJ of an active id whose REQ is unanswered (a
// destroy, an rdma_reject, or a failed rdma_establish: ib_send_cm_rej
// allows REQ_SENT). The passive id, not yet accepted, goes IDLE, and its
// event never reaches the process: ucma drops the events of a new
// connection's id until rdma_accept gives it a context
// (ucma_event_handler). Its Accept then fails.
func (id *cmid) rejectREQ() {
	if s := id.peer; s != nil {
		s.leaveStale()
		s.peer, s.state = nil, csIdle
	}
	id.peer = nil
	id.state = csIdle
}

// rejectPeer answers a pending request (or aborts after the REP) with the
// consumer-defined reject the kernel sends for rdma_reject, a failed accept
// or a destroyed id.
func (id *cmid) rejectPeer(pd []byte) {
	peer := id.peer
	id.leaveStale()
	id.peer = nil
	id.state = csIdle
	if peer == nil {
		return
	}
	if !id.reaches(peer) {
		id.cut(peer)
		return
	}
	peer.peer = nil
	peer.leaveStale()
	peer.state = csIdle
	if id.ex == kernel.ExchangeSIDR {
		peer.post(kernel.Event{Type: kernel.EventUnreachable, Status: kernel.SIDRRejected, PrivateData: pad(pd, budgetSIDRREP)})
	} else {
		peer.post(kernel.Event{Type: kernel.EventRejected, Status: kernel.RejConsumerDefined, PrivateData: pad(pd, budgetREJ)})
	}
}

func (p *Process) Reject(h kernel.ID, pd []byte) error {
	const op = "rdma_reject"
	p.lock()
	defer p.unlock()
	id, err := lookup[*cmid](p, op, uint64(h))
	if err != nil {
		return err
	}
	switch id.state {
	case csSIDRReqRcvd:
		if len(pd) > budgetSIDRREP {
			return opErr(op, syscall.EINVAL) // the request stays pending
		}
	case csReqSent, csReqRcvd, csRepSent, csRepRcvd:
		if len(pd) > budgetREJ {
			return opErr(op, syscall.EINVAL)
		}
	default:
		return opErr(op, syscall.EINVAL)
	}
	if err := id.sendFails(op); err != nil {
		return err
	}
	if id.state == csReqSent {
		id.rejectREQ()
		return nil
	}
	id.rejectPeer(pd)
	return nil
}

func (p *Process) Establish(h kernel.ID) error {
	const op = "rdma_establish"
	p.lock()
	defer p.unlock()
	id, err := lookup[*cmid](p, op, uint64(h))
	if err != nil {
		return err
	}
	if id.state == csReqSent && !p.n.failed {
		// rdma_establish is the kernel's rdma_accept: its RTU is refused
		// before the REP, and cma_rep_recv then rejects the request.
		id.rejectREQ()
	}
	if id.state != csRepRcvd {
		return opErr(op, syscall.EINVAL)
	}
	if err := id.sendFails(op); err != nil {
		return err
	}
	id.state = csEstablished
	if s := id.peer; s != nil && !id.reaches(s) {
		id.cut(s)
	} else if s != nil && s.state == csRepSent {
		s.state = csEstablished
		s.post(kernel.Event{Type: kernel.EventEstablished, QPNum: s.remoteQPN})
	}
	return nil
}

// sendDREQ: the id leaves the connection; its peer gets DISCONNECTED. With
// no peer left (an XRC TGT id destroyed silently), the remote CM answers the
// DREQ at once, so the sender is done too.
func (id *cmid) sendDREQ() {
	peer := id.peer
	if id.node().failed {
		// The DREQ's post fails: cm_send_dreq_locked enters timewait
		// and says nothing (no DREQ_ERROR, so no DISCONNECTED), and the
		// TIMEWAIT_EXIT that follows is dropped by cma_ib_handler,
		// the rdma_cm id still in RDMA_CM_CONNECT.
		if peer != nil {
			id.cut(peer)
		}
		id.leaveStale()
		id.state = csTimewait
		return
	}
	if peer != nil && !id.reaches(peer) {
		id.cut(peer) // no DREP comes: the DREQ times out (PowerOff)
		peer = nil
	}
	if peer == nil || peer.state != csEstablished {
		if peer != nil {
			peer.peer = nil
		}
		id.leaveStale()
		id.peer = nil
		id.state = csTimewait
		id.post(kernel.Event{Type: kernel.EventDisconnected})
		id.post(kernel.Event{Type: kernel.EventTimewaitExit})
		return
	}
	id.state = csDreqSent
	peer.state = csDreqRcvd
	peer.post(kernel.Event{Type: kernel.EventDisconnected})
}

// sendDREP answers a received DREQ.
func (id *cmid) sendDREP() {
	id.state = csTimewait
	id.leaveStale()
	// From or to a node that is off, the DREP is lost, and the DREQ times
	// out at its sender: the same events (without the retries' wait).
	if peer := id.peer; peer != nil && peer.state == csDreqSent {
		peer.leaveStale()
		peer.state, peer.peer = csTimewait, nil
		peer.post(kernel.Event{Type: kernel.EventDisconnected})
		peer.post(kernel.Event{Type: kernel.EventTimewaitExit})
	}
	id.peer = nil
}

func (p *Process) Disconnect(h kernel.ID) error {
	p.lock()
	defer p.unlock()
	id, err := lookup[*cmid](p, "rdma_disconnect", uint64(h))
	if err != nil {
		return err
	}
	switch id.state {
	case csEstablished:
		id.sendDREQ()
	case csDreqRcvd:
		id.sendDREP()
		id.post(kernel.Event{Type: kernel.EventTimewaitExit})
	}
	// Anything else (notably after CONNECT_RESPONSE) sends nothing and
	// still returns 0, as rdma_disconnect does.
	return nil
}

func (p *Process) DestroyID(h kernel.ID) error {
	return destroyHandle(p, "rdma_destroy_id", uint64(h), p.destroyID)
}

// destroyID sends what cm_destroy_id sends for the id's state (nothing on a
// node that is off).
func (p *Process) destroyID(id *cmid) {
	state := id.state
	if p.n.off && state != csListen && state != csDreqRcvd { // a DREQ's sender sees it time out, as a DREP
		state = csIdle
	}
	switch state {
	case csListen:
		delete(p.n.listeners, listenKey{spaceOf(id.ex), id.local.Port()})
		// Requests not yet taken from the listener go with it.
		for _, e := range id.events.items {
			if e.Type == kernel.EventConnectRequest {
				if c, ok := p.handles[uint64(e.ID)].(*cmid); ok {
					delete(p.handles, uint64(e.ID))
					p.destroyID(c)
				}
			}
		}
	case csReqSent:
		id.rejectREQ() // REJ(IB_CM_REJ_TIMEOUT)
	case csReqRcvd, csRepSent, csRepRcvd, csSIDRReqRcvd:
		id.rejectPeer(nil)
	case csEstablished:
		if id.tgtTyped {
			// cm_destroy_id for an XRC TGT: nothing is sent; the INI side
			// stays established.
			if id.peer != nil {
				id.peer.peer = nil
			}
		} else {
			id.sendDREQ()
		}
	case csDreqRcvd:
		id.sendDREP()
	case csSIDRReqSent:
		if s := id.peer; s != nil {
			s.peer = nil
		}
	}
	if id.peer != nil {
		id.peer.peer = nil
	}
	id.leaveStale()
	id.peer = nil
	id.dead = true
	id.events.close()
}

func (p *Process) Event(ctx context.Context, h kernel.ID) (kernel.Event, error) {
	var out [1]kernel.Event
	_, err := poll(ctx, p, "rdma_get_cm_event", func() (*queue[kernel.Event], error) {
		id, err := lookup[*cmid](p, "rdma_get_cm_event", uint64(h))
		if err != nil {
			return nil, err
		}
		return &id.events, nil
	}, nil, out[:])
	return out[0], err
}
