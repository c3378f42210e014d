// Package kcm is the CM half of the kernel seams that use the real RDMA CM
// (internal/kernel/hybrid and internal/kernel/real): kernel.Kernel's Listen,
// Connect, Accept, Reject, Establish, Disconnect, DestroyID and Event on
// librdmacm through package rdmacm, with the real CM's events mapped to
// kernel.Event exactly as internal/kernel/model produces them.
//
// XRC exchanges use XRC-typed ids (rdma_create_ep on RDMA_PS_IB: XRC_RECV
// listeners, XRC_SEND active ids), SIDR uses RDMA_PS_UDP, and both kinds of
// listener may share one port number. No QP is ever created here: Connect and
// Accept carry the caller's QP number, which may be made up.
//
// Where librdmacm and the model differ in what a call returns, the model
// wins: oversized private data is EINVAL (and a failed Accept rejects the
// peer), received private data is zero-padded to the message's budget.
package kcm

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/rdmacm"
	"github.com/goxrc/goxrc/verbs"
)

// Private-data budgets (IP addressing), as the model has them.
const (
	budgetREQ     = rdmacm.MaxReqPrivateData
	budgetREP     = rdmacm.MaxRepPrivateData
	budgetREJ     = rdmacm.MaxRejPrivateData
	budgetSIDRREQ = rdmacm.MaxSIDRReqPrivateData
	budgetSIDRREP = rdmacm.MaxSIDRRepPrivateData
)

// Path is what rdma_init_qp_attr needs from an id: the peer's QP number and
// address, learnt from CONNECT_REQUEST (passive) or CONNECT_RESPONSE (active).
type Path struct {
	RemoteQPN uint32
	Remote    netip.AddrPort
	Exchange  kernel.Exchange
	ID        *rdmacm.ID // the librdmacm id (for InitQPAttr)
}

type entry struct {
	id        *rdmacm.ID
	ex        kernel.Exchange
	passive   bool // an accepted (or pending) request's id
	remote    netip.AddrPort
	mu        sync.Mutex // guards remoteQPN
	remoteQPN uint32
}

// CM is one process's CM ids on one event channel.
type CM struct {
	local netip.Addr
	ch    *rdmacm.EventChannel

	mu     sync.Mutex
	ids    map[kernel.ID]*entry
	next   kernel.ID
	closed bool
	spares map[netip.AddrPort]*spare // SIDR ids resolved ahead, by destination
	used   int                       // spares taken by Connect

	prep       sync.WaitGroup // spares being resolved
	stop       context.Context
	stopSpares context.CancelFunc
}

// A SIDR exchange needs a fresh id each time (the kernel does not reuse an id
// after its REQ), but the address and route to a destination stay the same:
// after each SIDR Connect, one id to the same destination is resolved in the
// background, so the next exchange starts with its REQ. A spare older than
// spareMaxAge is dropped unused (routes change): when a Connect takes it, or
// when the table of at most maxSpares destinations is full.
type spare struct {
	done      chan struct{} // closed when resolving ended
	id        *rdmacm.ID    // set on success, under CM.mu
	ready     time.Time
	abandoned bool // a Connect took it, then gave up waiting: destroy it
}

const (
	spareMaxAge = 10 * time.Second
	maxSpares   = 64
)

// New opens an event channel for a process whose device has address local.
func New(local netip.Addr) (*CM, error) {
	ch, err := rdmacm.NewEventChannel()
	if err != nil {
		return nil, err
	}
	c := &CM{local: local, ch: ch, ids: map[kernel.ID]*entry{}, spares: map[netip.AddrPort]*spare{}}
	c.stop, c.stopSpares = context.WithCancel(context.Background())
	return c, nil
}

// resolved returns an id of port space ps resolved to dst: the spare if
// there is one (waiting for it if it is still resolving: it started first),
// else a new one resolved now.
func (c *CM) resolved(ctx context.Context, ps rdmacm.PortSpace, qt verbs.QPType, dst netip.AddrPort) (*rdmacm.ID, error) {
	if ps == rdmacm.PortSpaceUDP {
		if id, err := c.takeSpare(ctx, dst); id != nil || err != nil {
			return id, err
		}
	}
	return c.resolve(ctx, ps, qt, dst)
}

// resolve makes an id of port space ps and resolves its address and route
// from our own address to dst. From our address, not the wildcard: on a node
// whose route to dst leaves by another device or address, the id would
// otherwise sit on another device than the process's QPs, and the peer
// would see the request come from another address than the node it names.
func (c *CM) resolve(ctx context.Context, ps rdmacm.PortSpace, qt verbs.QPType, dst netip.AddrPort) (*rdmacm.ID, error) {
	id, err := c.ch.CreateID(ps, qt)
	if err != nil {
		return nil, err
	}
	if err = id.ResolveAddr(ctx, netip.AddrPortFrom(c.local, 0), dst); err == nil {
		err = id.ResolveRoute(ctx)
	}
	if err != nil {
		id.Close()
		return nil, err
	}
	return id, nil
}

// takeSpare returns the spare to dst, or nil if there is none usable.
func (c *CM) takeSpare(ctx context.Context, dst netip.AddrPort) (*rdmacm.ID, error) {
	c.mu.Lock()
	sp := c.spares[dst]
	delete(c.spares, dst)
	c.mu.Unlock()
	if sp == nil {
		return nil, nil
	}
	select {
	case <-sp.done:
	case <-ctx.Done():
		c.mu.Lock()
		sp.abandoned = true
		id := sp.id
		sp.id = nil
		c.mu.Unlock()
		if id != nil {
			id.Close() // resolved just now: nobody waits for it
		}
		return nil, opErr("rdma_resolve_addr", dst.String(), ctx.Err())
	}
	c.mu.Lock()
	id := sp.id
	sp.id = nil
	fresh := id != nil && time.Since(sp.ready) < spareMaxAge && !id.DeviceRemoved()
	if fresh {
		c.used++
	}
	c.mu.Unlock()
	if id != nil && !fresh {
		id.Close()
		return nil, nil
	}
	return id, nil
}

// reapSparesLocked forgets the spares too old to use (destinations not
// dialled again since), so that they do not hold the table's slots, and
// those on a device that went away (dropRemovedSpares may have run before
// the pump marked them), and returns their ids to destroy.
func (c *CM) reapSparesLocked() []*rdmacm.ID {
	var ids []*rdmacm.ID
	for dst, sp := range c.spares {
		removed := sp.id != nil && sp.id.DeviceRemoved()
		if !removed && (sp.ready.IsZero() || time.Since(sp.ready) < spareMaxAge) {
			continue // still resolving, or fresh
		}
		if sp.id != nil {
			ids = append(ids, sp.id)
			sp.id = nil
		}
		delete(c.spares, dst)
	}
	return ids
}

func closeAll(ids []*rdmacm.ID) {
	for _, id := range ids {
		id.Close()
	}
}

// prepareSpare resolves a SIDR id to dst in the background, unless one is
// there or being made.
func (c *CM) prepareSpare(dst netip.AddrPort) {
	c.mu.Lock()
	var stale []*rdmacm.ID
	if len(c.spares) >= maxSpares {
		stale = c.reapSparesLocked()
	}
	if c.closed || c.spares[dst] != nil || len(c.spares) >= maxSpares {
		c.mu.Unlock()
		closeAll(stale)
		return
	}
	sp := &spare{done: make(chan struct{})}
	c.spares[dst] = sp
	c.prep.Add(1)
	c.mu.Unlock()
	closeAll(stale)
	go func() {
		defer c.prep.Done()
		defer close(sp.done)
		ctx, cancel := context.WithTimeout(c.stop, spareMaxAge)
		defer cancel()
		id, err := c.resolve(ctx, rdmacm.PortSpaceUDP, verbs.QPTypeUD, dst)
		c.mu.Lock()
		defer c.mu.Unlock()
		if err != nil {
			if c.spares[dst] == sp {
				delete(c.spares, dst)
			}
			return
		}
		if c.closed || sp.abandoned {
			id.Close()
			return
		}
		sp.id, sp.ready = id, time.Now()
	}()
}

// Spares returns how many SIDR ids are resolved ahead and ready, and how
// many SIDR Connects so far started from one.
func (c *CM) Spares() (ready, used int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, sp := range c.spares {
		if sp.id != nil {
			ready++
		}
	}
	return ready, c.used
}

func opErr(op, addr string, err error) error { return &verbs.OpError{Op: op, Addr: addr, Err: err} }

func (c *CM) add(e *entry) (kernel.ID, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, opErr("rdma_create_id", "", verbs.ErrClosed)
	}
	c.next++
	c.ids[c.next] = e
	return c.next, nil
}

func (c *CM) get(op string, h kernel.ID) (*entry, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, opErr(op, "", verbs.ErrClosed)
	}
	e := c.ids[h]
	if e == nil {
		return nil, opErr(op, "", syscall.EBADF)
	}
	return e, nil
}

// PathOf returns what the id knows of its peer, for moving a QP to state
// (INIT, RTR or RTS). It fails with EINVAL, as rdma_init_qp_attr does,
// before the peer's QP number is known, on a SIDR id, and where the kernel
// CM refuses the move in the id's state (rdma_init_qp_attr asks it): after
// the peer rejected, disconnected or went, as with a QP on the device.
func (c *CM) PathOf(h kernel.ID, state verbs.QPState) (Path, error) {
	e, err := c.get("rdma_init_qp_attr", h)
	if err != nil {
		return Path{}, err
	}
	e.mu.Lock()
	qpn := e.remoteQPN
	e.mu.Unlock()
	if !e.ex.Connected() || qpn == 0 || !e.remote.IsValid() {
		return Path{}, opErr("rdma_init_qp_attr", "", syscall.EINVAL)
	}
	if _, _, err := e.id.InitQPAttr(state); err != nil {
		return Path{}, err
	}
	return Path{RemoteQPN: qpn, Remote: e.remote, Exchange: e.ex, ID: e.id}, nil
}

func spaceOf(ex kernel.Exchange) (rdmacm.PortSpace, verbs.QPType, bool) {
	switch ex {
	case kernel.ExchangeXRC:
		return rdmacm.PortSpaceIB, verbs.QPTypeXRCSend, true
	case kernel.ExchangeSIDR:
		return rdmacm.PortSpaceUDP, verbs.QPTypeUD, true
	case kernel.ExchangeRC:
		return rdmacm.PortSpaceTCP, verbs.QPTypeRC, true
	case kernel.ExchangeIBRC:
		return rdmacm.PortSpaceIB, verbs.QPTypeRC, true
	}
	return 0, 0, false
}

// Listen binds a listener: an XRC_RECV-typed endpoint on RDMA_PS_IB for
// ExchangeXRC, an RDMA_PS_UDP id for SIDR (both may share a port number).
func (c *CM) Listen(addr netip.AddrPort, ex kernel.Exchange) (kernel.ID, error) {
	ps, qt, ok := spaceOf(ex)
	if !ok {
		return 0, opErr("rdma_bind_addr", addr.String(), syscall.EADDRNOTAVAIL)
	}
	if !addr.Addr().IsValid() || addr.Addr().IsUnspecified() {
		// Bind to the device's address: that attaches the id to the device.
		addr = netip.AddrPortFrom(c.local, addr.Port())
	}
	var id *rdmacm.ID
	var err error
	if ex == kernel.ExchangeXRC {
		id, err = c.ch.CreateEndpoint(context.Background(), ps, verbs.QPTypeXRCRecv, addr, true)
	} else {
		if id, err = c.ch.CreateID(ps, qt); err == nil {
			if err = id.Bind(addr); err != nil {
				id.Close()
			}
		}
	}
	if err != nil {
		return 0, err
	}
	if err := id.Listen(64); err != nil {
		id.Close()
		return 0, err
	}
	h, err := c.add(&entry{id: id, ex: ex})
	if err != nil {
		id.Close()
	}
	return h, err
}

// Connect resolves dst and sends the REQ (or SIDR REQ) naming qpNum.
func (c *CM) Connect(ctx context.Context, dst netip.AddrPort, ex kernel.Exchange, qpNum uint32, pd []byte) (kernel.ID, error) {
	const op = "rdma_connect"
	if err := ctx.Err(); err != nil {
		return 0, opErr(op, dst.String(), err)
	}
	ps, qt, ok := spaceOf(ex)
	if !ok {
		return 0, opErr(op, dst.String(), syscall.EINVAL)
	}
	budget := budgetREQ
	if ex == kernel.ExchangeSIDR {
		budget = budgetSIDRREQ
	}
	if len(pd) > budget {
		return 0, opErr(op, dst.String(), syscall.EINVAL)
	}
	var id *rdmacm.ID
	var err error
	if ex == kernel.ExchangeXRC {
		id, err = c.ch.CreateEndpointFrom(ctx, ps, verbs.QPTypeXRCSend, c.local, dst)
	} else {
		id, err = c.resolved(ctx, ps, qt, dst)
	}
	if err != nil {
		return 0, err
	}
	if ex == kernel.ExchangeSIDR {
		c.prepareSpare(dst)
	}
	p := rdmacm.ConnParam{QPNum: qpNum & 0xFFFFFF, PrivateData: pd}
	if ex.Connected() {
		p.ResponderResources, p.InitiatorDepth = 1, 1
		p.RetryCount, p.RNRRetryCount = rdmacm.RetryCountFinite, 7
		p.SRQ = ex == kernel.ExchangeXRC
	}
	h, err := c.add(&entry{id: id, ex: ex, remote: dst})
	if err != nil {
		id.Close()
		return 0, err
	}
	if err := id.Connect(p); err != nil {
		c.DestroyID(h)
		return 0, err
	}
	return h, nil
}

// Accept answers a CONNECT_REQUEST with a REP (or SIDR REP) naming qpNum.
// Private data over the budget fails with EINVAL and rejects the peer, as a
// failed rdma_accept does.
func (c *CM) Accept(h kernel.ID, qpNum uint32, pd []byte) error {
	const op = "rdma_accept"
	e, err := c.get(op, h)
	if err != nil {
		return err
	}
	if !e.passive {
		return opErr(op, "", syscall.EINVAL)
	}
	budget := budgetREP
	if e.ex == kernel.ExchangeSIDR {
		budget = budgetSIDRREP
	}
	if len(pd) > budget {
		e.id.Reject(nil)
		return opErr(op, e.remote.String(), syscall.EINVAL)
	}
	p := rdmacm.ConnParam{QPNum: qpNum & 0xFFFFFF, PrivateData: pd}
	if e.ex.Connected() {
		p.ResponderResources, p.InitiatorDepth, p.RNRRetryCount = 1, 1, 7
		p.SRQ = e.ex == kernel.ExchangeXRC
	}
	return e.id.Accept(p)
}

// Reject answers a CONNECT_REQUEST, or aborts after CONNECT_RESPONSE.
// Oversized private data is EINVAL and the request stays pending.
func (c *CM) Reject(h kernel.ID, pd []byte) error {
	const op = "rdma_reject"
	e, err := c.get(op, h)
	if err != nil {
		return err
	}
	budget := budgetREJ
	if e.ex == kernel.ExchangeSIDR {
		budget = budgetSIDRREP
	}
	if len(pd) > budget {
		return opErr(op, e.remote.String(), syscall.EINVAL)
	}
	return e.id.Reject(pd)
}

// Establish sends the RTU: on an active id of a connected exchange (XRC,
// RC or IB-RC), as the model has it; a passive id and SIDR are refused
// (EINVAL). librdmacm's rdma_establish on a passive id (with no QP, as all
// of ours are) is an accept: it would reject its request (the RTU fails,
// and the kernel sends a REJ) or, for SIDR, accept it.
func (c *CM) Establish(h kernel.ID) error {
	const op = "rdma_establish"
	e, err := c.get(op, h)
	if err != nil {
		return err
	}
	if e.passive || e.ex == kernel.ExchangeSIDR {
		return opErr(op, e.remote.String(), syscall.EINVAL)
	}
	return e.id.Establish()
}

// Disconnect sends a DREQ, or the DREP after a DREQ.
func (c *CM) Disconnect(h kernel.ID) error {
	e, err := c.get("rdma_disconnect", h)
	if err != nil {
		return err
	}
	return e.id.Disconnect()
}

// DestroyID destroys the id (rdma_destroy_id).
func (c *CM) DestroyID(h kernel.ID) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return opErr("rdma_destroy_id", "", verbs.ErrClosed)
	}
	e := c.ids[h]
	delete(c.ids, h)
	c.mu.Unlock()
	if e == nil {
		return opErr("rdma_destroy_id", "", syscall.EBADF)
	}
	err := e.id.Close()
	if err != nil {
		// The id lives on in C: keep its handle, so that a retry, or
		// Close, destroys it; once Close has taken the ids, try once
		// more here, as Close does.
		c.mu.Lock()
		closed := c.closed
		if !closed {
			c.ids[h] = e
		}
		c.mu.Unlock()
		if closed {
			err = e.id.Close()
		}
	}
	return err
}

// dropRemovedSpares destroys the spare ids on a device that went away:
// nothing can use them, and librdmacm's manual asks for it.
func (c *CM) dropRemovedSpares() {
	c.mu.Lock()
	var gone []*rdmacm.ID
	for dst, sp := range c.spares {
		if sp.id != nil && sp.id.DeviceRemoved() {
			gone = append(gone, sp.id)
			sp.id = nil
			delete(c.spares, dst)
		}
	}
	c.mu.Unlock()
	for _, id := range gone {
		id.Close()
	}
}

func pad(pd []byte, n int) []byte {
	b := make([]byte, max(n, len(pd)))
	copy(b, pd)
	return b
}

// Event waits for the id's next event of a kind the seam knows, mapped as the
// model maps it.
func (c *CM) Event(ctx context.Context, h kernel.ID) (kernel.Event, error) {
	e, err := c.get("rdma_get_cm_event", h)
	if err != nil {
		return kernel.Event{}, err
	}
	for {
		re, err := e.id.Event(ctx)
		if err == nil && re.Type == rdmacm.EventDeviceRemoval {
			c.dropRemovedSpares()
			return kernel.Event{}, opErr("rdma_get_cm_event", "", kernel.ErrDeviceRemoved)
		}
		if err != nil {
			if errors.Is(err, rdmacm.ErrClosed) {
				// Destroyed meanwhile (or the process closed): like the
				// model, a wait on a dead handle is EBADF / ErrClosed.
				if _, err2 := c.get("rdma_get_cm_event", h); err2 != nil {
					return kernel.Event{}, err2
				}
			}
			return kernel.Event{}, err
		}
		if ke, ok := c.mapEvent(h, e, re); ok {
			return ke, nil
		}
	}
}

func (c *CM) mapEvent(h kernel.ID, e *entry, re rdmacm.Event) (kernel.Event, bool) {
	ke := kernel.Event{ID: h, Exchange: e.ex, Remote: e.remote, Status: re.Status}
	sidr := e.ex == kernel.ExchangeSIDR
	switch re.Type {
	case rdmacm.EventConnectRequest:
		n := &entry{id: re.ID, ex: e.ex, passive: true, remote: re.ID.RemoteAddr()}
		ke.Type, ke.Remote, ke.Status = kernel.EventConnectRequest, n.remote, 0
		if sidr {
			ke.PrivateData = pad(re.PrivateData, budgetSIDRREQ) // a SIDR REQ carries no QPN
		} else {
			n.remoteQPN = re.Conn.QPNum & 0xFFFFFF
			ke.QPNum = n.remoteQPN
			ke.PrivateData = pad(re.PrivateData, budgetREQ)
		}
		nh, err := c.add(n)
		if err != nil {
			re.ID.Close()
			return ke, false
		}
		ke.ID = nh
	case rdmacm.EventConnectResponse:
		e.mu.Lock()
		e.remoteQPN = re.Conn.QPNum & 0xFFFFFF
		e.mu.Unlock()
		ke.Type, ke.QPNum = kernel.EventConnectResponse, re.Conn.QPNum&0xFFFFFF
		ke.PrivateData = pad(re.PrivateData, budgetREP)
	case rdmacm.EventEstablished:
		ke.Type = kernel.EventEstablished
		if sidr {
			ke.QPNum, ke.QKey = re.UD.QPNum&0xFFFFFF, re.UD.QKey
			ke.PrivateData = pad(re.PrivateData, budgetSIDRREP)
		} else {
			e.mu.Lock()
			ke.QPNum = e.remoteQPN
			e.mu.Unlock()
		}
	case rdmacm.EventRejected:
		ke.Type = kernel.EventRejected
		if sidr {
			ke.Type = kernel.EventUnreachable
			ke.PrivateData = pad(re.PrivateData, budgetSIDRREP)
		} else {
			ke.PrivateData = pad(re.PrivateData, budgetREJ)
		}
	case rdmacm.EventUnreachable, rdmacm.EventConnectError:
		ke.Type = kernel.EventUnreachable
		if sidr {
			ke.PrivateData = pad(re.PrivateData, budgetSIDRREP)
		}
	case rdmacm.EventAddrError, rdmacm.EventRouteError:
		// Ids here are resolved before they are added, so these come
		// after the request: the kernel turns a SIDR REP it cannot use
		// (a peer's qkey it refuses) into ADDR_ERROR with its errno.
		ke.Type = kernel.EventUnreachable
	case rdmacm.EventDisconnected:
		ke.Type, ke.Status = kernel.EventDisconnected, 0
	case rdmacm.EventTimewaitExit:
		ke.Type, ke.Status = kernel.EventTimewaitExit, 0
	default:
		return ke, false // address changes, multicast: nothing the seam knows
	}
	return ke, true
}

// Close destroys every id and the event channel, as process exit does.
func (c *CM) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	ids := c.ids
	c.ids = nil
	spares := c.spares
	c.spares = nil
	c.mu.Unlock()
	c.stopSpares()
	c.prep.Wait() // a spare that finishes now sees closed and destroys its id
	for _, sp := range spares {
		if sp.id != nil {
			sp.id.Close()
		}
	}
	// Passive ids first, then active ids, then listeners: a listener's
	// unclaimed requests go with it.
	var errs []error
	for _, pass := range []func(*entry) bool{
		func(e *entry) bool { return e.passive },
		func(e *entry) bool { return !e.passive && e.remote.IsValid() },
		func(*entry) bool { return true },
	} {
		for h, e := range ids {
			if pass(e) {
				if e.id.Close() != nil {
					errs = append(errs, e.id.Close()) // once more: rdmacm retries the destroy
				}
				delete(ids, h)
			}
		}
	}
	return errors.Join(append(errs, c.ch.Close())...)
}

// RawID returns the librdmacm id behind h (for InitQPAttr).
func (c *CM) RawID(h kernel.ID) (*rdmacm.ID, error) {
	e, err := c.get("rdma_init_qp_attr", h)
	if err != nil {
		return nil, err
	}
	return e.id, nil
}

// Len is the number of live CM ids (listeners, requests handed out, active);
// spare SIDR ids (see Spares) are not among them.
func (c *CM) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.ids)
}
