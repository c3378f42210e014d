package rdmacm

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/goxrc/goxrc/internal/cbridge"
	"github.com/goxrc/goxrc/internal/faults"
	"github.com/goxrc/goxrc/internal/objtrace"
	"github.com/goxrc/goxrc/verbs"
)

// DefaultResolveTimeout is the kernel timeout of ResolveAddr and
// ResolveRoute when their context has no deadline.
const DefaultResolveTimeout = 2 * time.Second

var (
	liveChannels = objtrace.Counter{Kind: "CM event channel"}
	liveIDs      = objtrace.Counter{Kind: "CM id"}
)

// Counts returns how many event channels and CM ids are alive in this
// process; both are zero when everything has been closed.
//
// The kernel lists every process's ids that are on a device with
// `rdma resource show cm_id` (a wildcard listener as its per-device ids).
func Counts() Counters {
	return Counters{Channels: int(liveChannels.Load()), IDs: int(liveIDs.Load())}
}

// EventChannel is an RDMA CM event channel with its event pump: one goroutine
// that waits for the channel's descriptor in Go's netpoller, reads every
// event, copies and acknowledges it at once, and queues it on the ID it
// belongs to. Create ids on it with CreateID or CreateEndpoint.
type EventChannel struct {
	mu        sync.Mutex
	closed    bool  // Close began: no new ids, no more events
	broken    error // the pump failed: no new ids (they would get no events)
	stopped   bool  // the pump has exited: the C channel may go
	destroyed bool
	ids       map[uintptr]*ID // by handle, the value librdmacm keeps as the id's context
	next      uintptr
	live      int           // ids created on this channel and not yet destroyed
	closeDone chan struct{} // closed when the first Close has returned
	sys       chanSys
}

// NewEventChannel creates an event channel and starts its pump. Without RDMA
// (no /dev/infiniband/rdma_cm, no rdma_ucm module) it fails with an
// *verbs.OpError naming rdma_create_event_channel; on platforms without
// RDMA support the error satisfies errors.Is(err, ErrNotSupported).
func NewEventChannel() (*EventChannel, error) {
	c := &EventChannel{ids: make(map[uintptr]*ID), closeDone: make(chan struct{})}
	if err := c.sysOpen(); err != nil {
		return nil, err
	}
	liveChannels.Created(c)
	return c, nil
}

func (c *EventChannel) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// Err reports why the channel broke, or nil: its pump failed to read an
// event, every waiter on its ids failed with that error, and no new id can
// be made on it. Make a new channel.
func (c *EventChannel) Err() error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.broken
}

// refusesLocked says why no id can be made on c now, if so.
func (c *EventChannel) refusesLocked() error {
	if c.closed || c.ids == nil { // closed, or a zero value never opened
		return ErrClosed
	}
	return c.broken
}

// register creates the Go side of a CM id and gives it a handle.
func (c *EventChannel) registerLocked(ps PortSpace, qpType verbs.QPType) *ID {
	c.next++
	id := &ID{ch: c, handle: c.next, ps: ps, qpType: qpType}
	id.q.init()
	c.ids[id.handle] = id
	c.live++
	liveIDs.Created(id)
	return id
}

// unregister forgets a handle whose C id could not be created.
func (c *EventChannel) unregister(id *ID) {
	c.mu.Lock()
	delete(c.ids, id.handle)
	c.live--
	liveIDs.Destroyed(id)
	destroy := c.destroyLocked()
	c.mu.Unlock()
	if destroy {
		c.sysDestroy()
	}
}

// destroyLocked reports whether the caller must destroy the C channel now:
// once the pump has stopped and the last id is gone, exactly once.
func (c *EventChannel) destroyLocked() bool {
	if c.stopped && c.live == 0 && !c.destroyed {
		c.destroyed = true
		return true
	}
	return false
}

func (c *EventChannel) lookup(h uintptr) *ID {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ids[h]
}

// CreateID creates a CM id with rdma_create_id. The port space decides the
// QP type: PortSpaceTCP and PortSpaceIB take verbs.QPTypeRC, PortSpaceUDP and
// PortSpaceIPoIB verbs.QPTypeUD, and any other pair is refused (rdma_create_id
// types an id by its port space alone). XRC-typed ids, and UD ids on
// PortSpaceIB, come from CreateEndpoint.
func (c *EventChannel) CreateID(ps PortSpace, qpType verbs.QPType) (*ID, error) {
	const op = "rdma_create_id"
	if c == nil {
		return nil, &verbs.OpError{Op: op, Err: ErrClosed}
	}
	if !spaceTakes(ps, qpType) || qpType != createIDType(ps) {
		return nil, &verbs.OpError{Op: op, Addr: ps.String() + "/" + qpType.String(),
			Err: errors.New("unsupported port space and QP type (rdma_create_id types TCP and IB ids RC, UDP and IPOIB ids UD; other types on PortSpaceIB come from CreateEndpoint)")}
	}
	c.mu.Lock()
	if err := c.refusesLocked(); err != nil {
		c.mu.Unlock()
		return nil, &verbs.OpError{Op: op, Err: err}
	}
	id := c.registerLocked(ps, qpType)
	c.mu.Unlock()
	if err := id.sysCreate(); err != nil {
		c.unregister(id)
		return nil, &verbs.OpError{Op: op, Addr: ps.String(), Err: err}
	}
	return id, nil
}

// CreateEndpoint creates a CM id of any QP type librdmacm knows, XRC
// included (verbs.QPTypeXRCSend for the active INI side, verbs.QPTypeXRCRecv
// for the passive TGT side, on PortSpaceIB), the only way to type an id as
// XRC. It uses rdma_create_ep without a PD or QP attributes and moves the id
// to this channel with rdma_migrate_id.
//
// A passive endpoint is bound to addr (call Listen next). An active endpoint
// is bound to the wildcard address of addr's family and then resolved to
// addr asynchronously (address and route, through this channel, within ctx):
// rdma_create_ep's own active path would resolve synchronously in C, which
// this package never does. The addrinfo is built here from the numeric
// address (what rdma_getaddrinfo with RAI_NUMERICHOST would return), so no
// name lookup happens either.
func (c *EventChannel) CreateEndpoint(ctx context.Context, ps PortSpace, qpType verbs.QPType, addr netip.AddrPort, passive bool) (*ID, error) {
	if passive {
		return c.createEndpoint(ctx, ps, qpType, addr, netip.AddrPort{})
	}
	return c.CreateEndpointFrom(ctx, ps, qpType, netip.Addr{}, addr)
}

// CreateEndpointFrom is CreateEndpoint's active side, bound to src (any
// port) rather than the wildcard, so that the id resolves from src: from
// src's device, with src as the address the peer sees. The zero src means
// the wildcard.
//
// Equivalent to: rdma_create_ep with ai_src_addr SRC, then
// rdma_resolve_addr and rdma_resolve_route to DST.
func (c *EventChannel) CreateEndpointFrom(ctx context.Context, ps PortSpace, qpType verbs.QPType, src netip.Addr, dst netip.AddrPort) (*ID, error) {
	if !dst.IsValid() {
		return nil, &verbs.OpError{Op: "rdma_create_ep", Err: errors.New("invalid destination address")}
	}
	if !src.IsValid() {
		src = netip.IPv4Unspecified()
		if dst.Addr().Is6() && !dst.Addr().Is4In6() {
			src = netip.IPv6Unspecified()
		}
	}
	return c.createEndpoint(ctx, ps, qpType, netip.AddrPortFrom(src, 0), dst)
}

// createEndpoint makes an id bound to bind and, when dst is valid (an
// active endpoint), resolves it to dst.
func (c *EventChannel) createEndpoint(ctx context.Context, ps PortSpace, qpType verbs.QPType, bind, dst netip.AddrPort) (*ID, error) {
	const op = "rdma_create_ep"
	addr := bind
	if dst.IsValid() {
		addr = dst
	}
	if c == nil {
		return nil, &verbs.OpError{Op: op, Err: ErrClosed}
	}
	if !spaceTakes(ps, qpType) {
		return nil, &verbs.OpError{Op: op, Addr: ps.String() + "/" + qpType.String(),
			Err: errors.New("the port space does not take the QP type (the kernel makes TCP ids RC and UDP and IPOIB ids UD; XRC needs PortSpaceIB)")}
	}
	if !addr.IsValid() {
		return nil, &verbs.OpError{Op: op, Err: errors.New("invalid address")}
	}
	c.mu.Lock()
	if err := c.refusesLocked(); err != nil {
		c.mu.Unlock()
		return nil, &verbs.OpError{Op: op, Err: err}
	}
	id := c.registerLocked(ps, qpType)
	c.mu.Unlock()
	if err := id.sysCreateEP(bind); err != nil {
		c.unregister(id)
		if bind.IsValid() && !bind.Addr().IsUnspecified() { // its bind failed: dst was not tried yet
			addr = bind
		}
		return nil, &verbs.OpError{Op: op, Addr: addr.String(), Err: err}
	}
	if !dst.IsValid() {
		return id, nil
	}
	if err := id.ResolveAddr(ctx, netip.AddrPort{}, dst); err != nil {
		id.Close()
		return nil, err
	}
	if err := id.ResolveRoute(ctx); err != nil {
		id.Close()
		return nil, err
	}
	return id, nil
}

// createIDType is the QP type rdma_create_id gives an id of port space ps
// (it takes no QP type): UD on the UDP and IPoIB port spaces, RC on the
// others. An ID recording another type than its C id's would check private
// data against another message's budget, refuse MoveQP (or not), and report
// the wrong QPType.
func createIDType(ps PortSpace) verbs.QPType {
	if ps == PortSpaceUDP || ps == PortSpaceIPoIB {
		return verbs.QPTypeUD
	}
	return verbs.QPTypeRC
}

// spaceTakes reports whether an id of port space ps may be typed t. The
// kernel makes a TCP id RC and a UDP or IPoIB id UD whatever type librdmacm
// records, and librdmacm reads an id's events as its recorded type's: a
// mismatch misreads every event's parameters.
func spaceTakes(ps PortSpace, t verbs.QPType) bool {
	switch ps {
	case PortSpaceTCP:
		return t == verbs.QPTypeRC
	case PortSpaceUDP, PortSpaceIPoIB:
		return t == verbs.QPTypeUD
	case PortSpaceIB:
		return true
	}
	return false
}

// Close stops the pump, and every waiter on the channel's ids returns
// ErrClosed once the events already queued are consumed. Operations on the
// ids then fail with ErrClosed, but the ids stay allocated until each is
// closed: the C channel is destroyed with the last of them (or here, when
// none is left). Close is idempotent; a Close while another runs returns
// when that one has.
func (c *EventChannel) Close() error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	if c.closed || c.ids == nil { // a zero value has nothing to stop
		c.closed = true
		done := c.closeDone
		c.mu.Unlock()
		if done != nil {
			<-done
		}
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	if c.closeDone != nil {
		defer close(c.closeDone)
	}
	c.sysStop() // the pump has exited when this returns
	c.mu.Lock()
	c.stopped = true
	ids := make([]*ID, 0, len(c.ids))
	for _, id := range c.ids {
		ids = append(ids, id)
	}
	destroy := c.destroyLocked()
	c.mu.Unlock()
	for _, id := range ids {
		id.q.close(ErrClosed, false)
	}
	liveChannels.Destroyed(c)
	if destroy {
		c.sysDestroy()
	}
	return nil
}

// ID is an RDMA CM identifier (struct rdma_cm_id): the CM's handle on one
// endpoint of a connection, a listener, or a datagram (SIDR) exchange. It
// owns no QP: Connect and Accept name the caller's QP by number. Its methods
// are safe for concurrent use.
type ID struct {
	ch     *EventChannel
	handle uintptr
	ps     PortSpace
	qpType verbs.QPType
	q      eventQueue
	// deviceRemoved: the id's device reported EventDeviceRemoval.
	deviceRemoved atomic.Bool

	mu        sync.RWMutex // held for writing by Close only
	closed    bool         // Close began: no more use
	destroyed bool         // rdma_destroy_id succeeded
	sys       idSys
}

// DeviceRemoved reports whether the id's device has gone away: an
// EventDeviceRemoval for this id has arrived (whether or not it was read
// yet). The kernel has destroyed its side of the id; what is left is to
// destroy the verbs objects on the device, then the id (librdmacm's manual
// asks for that).
func (id *ID) DeviceRemoved() bool { return id != nil && id.deviceRemoved.Load() }

// use locks the id for a C call; it fails with ErrClosed after Close of the
// id or of its channel.
func (id *ID) use(op string) (func(), error) {
	if id == nil || id.ch == nil {
		return nil, &verbs.OpError{Op: op, Err: ErrClosed}
	}
	id.mu.RLock()
	if id.closed || id.ch.isClosed() {
		id.mu.RUnlock()
		return nil, &verbs.OpError{Op: op, Err: ErrClosed}
	}
	return id.mu.RUnlock, nil
}

// readID returns what read finds in the id's C fields, under the id's read
// lock; the zero value after Close.
func readID[T any](id *ID, read func() T) T {
	var zero T
	if id == nil || id.ch == nil {
		return zero
	}
	id.mu.RLock()
	defer id.mu.RUnlock()
	if id.closed {
		return zero
	}
	return read()
}

// opErr wraps a failed operation's error with the address it concerns;
// addr is called only on failure, as it may call into C.
func (id *ID) opErr(op string, err error, addr func() string) error {
	if err == nil {
		return nil
	}
	where := ""
	if addr != nil {
		where = addr()
	}
	if where == "" {
		if dev := id.sysDeviceName(); dev != "" {
			where = dev
		}
	}
	return &verbs.OpError{Op: op, Addr: where, Err: err}
}

func (id *ID) localString() string  { return id.sysLocalAddr().String() }
func (id *ID) remoteString() string { return id.sysRemoteAddr().String() }

// PortSpace returns the id's port space.
func (id *ID) PortSpace() PortSpace {
	if id == nil {
		return 0
	}
	return id.ps
}

// QPType returns the QP type the id was created for.
func (id *ID) QPType() verbs.QPType {
	if id == nil {
		return 0
	}
	return id.qpType
}

// Channel returns the event channel the id delivers its events to.
func (id *ID) Channel() *EventChannel {
	if id == nil {
		return nil
	}
	return id.ch
}

func (id *ID) ud() bool { return id.qpType == verbs.QPTypeUD }

// Bind binds the id to a local address (rdma_bind_addr); a port of 0 picks
// one. Binding to an RDMA device's address attaches the id to that device.
func (id *ID) Bind(addr netip.AddrPort) error {
	const op = "rdma_bind_addr"
	unlock, err := id.use(op)
	if err != nil {
		return err
	}
	defer unlock()
	if !addr.IsValid() {
		return &verbs.OpError{Op: op, Err: syscall.EINVAL}
	}
	return id.opErr(op, id.sysBind(addr), addr.String)
}

// kernelTimeout turns ctx's deadline into the millisecond timeout of a
// resolve call. It keeps a margin (a tenth, at most 250 ms) so that the
// kernel's own verdict, with its errno, usually arrives before ctx ends.
func kernelTimeout(ctx context.Context) int {
	d := DefaultResolveTimeout
	if dl, ok := ctx.Deadline(); ok {
		d = time.Until(dl)
		d -= min(d/10, 250*time.Millisecond)
	}
	ms := d.Milliseconds()
	if ms < 1 {
		ms = 1
	}
	if ms > 1<<30 {
		ms = 1 << 30
	}
	return int(ms)
}

// ResolveAddr resolves dst (and src, which may be the zero AddrPort) to an
// RDMA device and port (rdma_resolve_addr), and waits for ADDR_RESOLVED.
// The kernel's timeout is a little less than the time left until ctx's
// deadline, or DefaultResolveTimeout without one. An address that does not resolve returns a
// *verbs.OpError: its Timeout() is true when the resolution timed out (the
// kernel's ADDR_ERROR with ETIMEDOUT, or ctx's deadline), otherwise it wraps
// the kernel's errno. Where ctx has a deadline, the kernel's ETIMEDOUT is that
// deadline running out and matches context.DeadlineExceeded (and
// os.ErrDeadlineExceeded) as well, as ctx's own end does. After an error,
// close the id.
func (id *ID) ResolveAddr(ctx context.Context, src, dst netip.AddrPort) error {
	const op = "rdma_resolve_addr"
	unlock, err := id.use(op)
	if err != nil {
		return err
	}
	if !dst.IsValid() {
		unlock()
		return &verbs.OpError{Op: op, Err: syscall.EINVAL}
	}
	err = id.sysResolveAddr(src, dst, kernelTimeout(ctx))
	unlock()
	where := dst.String()
	if src.IsValid() {
		where += " from " + src.Addr().String()
	}
	if err != nil {
		return &verbs.OpError{Op: op, Addr: where, Err: err}
	}
	_, err = id.wait(ctx, EventAddrResolved, op, where)
	return deadlineTimeout(ctx, err)
}

// ResolveRoute resolves the route to the address given to ResolveAddr
// (rdma_resolve_route) and waits for ROUTE_RESOLVED, with timeouts as in
// ResolveAddr.
func (id *ID) ResolveRoute(ctx context.Context) error {
	const op = "rdma_resolve_route"
	unlock, err := id.use(op)
	if err != nil {
		return err
	}
	err = id.sysResolveRoute(kernelTimeout(ctx))
	addr := id.sysRemoteAddr().String()
	unlock()
	if err != nil {
		return &verbs.OpError{Op: op, Addr: addr, Err: err}
	}
	_, err = id.wait(ctx, EventRouteResolved, op, addr)
	return deadlineTimeout(ctx, err)
}

// deadlineTimeout is err, a resolution's, made to match
// context.DeadlineExceeded too where it is the kernel's ETIMEDOUT and ctx
// has a deadline: the kernel's timeout was that deadline's (kernelTimeout),
// which its verdict only precedes by the margin. It matched ETIMEDOUT alone,
// or the deadline alone when ctx's end came first: which came first decided
// what the error said.
func deadlineTimeout(ctx context.Context, err error) error {
	var oe *verbs.OpError
	if _, ok := ctx.Deadline(); !ok || !errors.As(err, &oe) || !errors.Is(oe.Err, syscall.ETIMEDOUT) {
		return err
	}
	return &verbs.OpError{Op: oe.Op, Addr: oe.Addr, Err: fmt.Errorf("%w: %w", oe.Err, context.DeadlineExceeded)}
}

// Listen starts listening on the bound address (rdma_listen). Connection
// requests arrive as CONNECT_REQUEST events on this id, each with a new ID.
// The kernel bounds backlog by net.rdma_ucm.max_backlog and takes one of 0
// or less as that bound (sysctl net.rdma_ucm.max_backlog shows it).
func (id *ID) Listen(backlog int) error {
	const op = "rdma_listen"
	unlock, err := id.use(op)
	if err != nil {
		return err
	}
	defer unlock()
	return id.opErr(op, id.sysListen(kernelBacklog(backlog)), id.localString)
}

// kernelBacklog fits backlog into rdma_listen's int: a larger one means the
// kernel's bound, as it does before conversion, rather than wrapping to a
// small or negative number; a smaller (negative) one stays negative, which
// means that bound too, rather than wrapping to a small positive one.
func kernelBacklog(backlog int) int32 {
	return int32(max(min(backlog, math.MaxInt32), math.MinInt32))
}

// Connect sends a connection request (rdma_connect): a REQ (private data up
// to MaxReqPrivateData) on connected-mode ids, a SIDR REQ (up to
// MaxSIDRReqPrivateData) on PortSpaceUDP. It does not wait: the answer is
// CONNECT_RESPONSE (the peer's REP: move your QP with InitQPAttr, then
// Establish), ESTABLISHED for SIDR, or REJECTED / UNREACHABLE.
// Oversized private data fails with ErrPrivateDataTooLong, and a QPNum over
// 24 bits with EINVAL, before anything is sent, and the id stays usable.
func (id *ID) Connect(p ConnParam) error {
	return id.sendMAD("rdma_connect", MaxReqPrivateData, MaxSIDRReqPrivateData, p.PrivateData,
		func() error { return qpNumOK(p.QPNum, func() error { return id.sysConnect(&p) }) })
}

// qpNumOK refuses a QP number over 24 bits (EINVAL) before call: the CM
// message carries 24, and the kernel would send the number's low bits,
// another QP's number.
func qpNumOK(n uint32, call func() error) error {
	if n > 0xffffff {
		return fmt.Errorf("QP number %#x over 24 bits: %w", n, syscall.EINVAL)
	}
	return call()
}

// Accept accepts the connection request this id came with (rdma_accept):
// a REP naming p.QPNum (private data up to MaxRepPrivateData), or on
// PortSpaceUDP a SIDR REP (QPNum and up to MaxSIDRRepPrivateData). Prepare
// the QP first (InitQPAttr to RTR, and RTS). The connected-mode passive side
// then gets ESTABLISHED when the peer calls Establish. An Accept that the
// kernel fails rejects the request (cma.c rejects on its way out); one
// refused before it reaches the kernel (ErrPrivateDataTooLong, EINVAL for a
// QPNum over 24 bits, or librdmacm's EINVAL for bad parameters) leaves the
// request pending:
// Reject or Close the id.
func (id *ID) Accept(p ConnParam) error {
	return id.sendMAD("rdma_accept", MaxRepPrivateData, MaxSIDRRepPrivateData, p.PrivateData,
		func() error { return qpNumOK(p.QPNum, func() error { return id.sysAccept(&p) }) })
}

// Reject rejects the connection request this id came with, or (on the
// active side, after CONNECT_RESPONSE) the peer's reply (rdma_reject). The
// peer sees REJECTED with reason 28 (consumer defined) and up to
// MaxRejPrivateData bytes, or on PortSpaceUDP UNREACHABLE with SIDR status 2
// and up to MaxSIDRRepPrivateData bytes.
func (id *ID) Reject(privateData []byte) error {
	return id.sendMAD("rdma_reject", MaxRejPrivateData, MaxSIDRRepPrivateData, privateData,
		func() error { return id.sysReject(privateData) })
}

// sendMAD makes a call that sends a CM message carrying private data: the
// data is checked against the limit of the id's kind (connected or SIDR)
// before anything is sent.
func (id *ID) sendMAD(op string, limit, sidrLimit int, privateData []byte, call func() error) error {
	unlock, err := id.use(op)
	if err != nil {
		return err
	}
	defer unlock()
	if id.ud() {
		limit = sidrLimit
	}
	if err := checkPrivateData(op, limit, privateData); err != nil {
		return err
	}
	return id.opErr(op, call(), id.remoteString)
}

// Establish completes a connection on the active side after
// CONNECT_RESPONSE, once the caller's QP is in RTR/RTS (rdma_establish): it
// sends the RTU, and the passive side gets ESTABLISHED.
func (id *ID) Establish() error {
	const op = "rdma_establish"
	unlock, err := id.use(op)
	if err != nil {
		return err
	}
	defer unlock()
	return id.opErr(op, id.sysEstablish(), id.remoteString)
}

// Disconnect sends a DREQ, or answers the peer's with a DREP
// (rdma_disconnect). Both sides then get DISCONNECTED, and TIMEWAIT_EXIT
// about two seconds later. librdmacm returns success even when nothing could
// be sent (for instance after CONNECT_RESPONSE: use Reject or Close there).
func (id *ID) Disconnect() error {
	const op = "rdma_disconnect"
	unlock, err := id.use(op)
	if err != nil {
		return err
	}
	defer unlock()
	return id.opErr(op, id.sysDisconnect(), id.remoteString)
}

// InitQPAttr returns the attributes and the mask that move a QP of this
// connection to state (rdma_init_qp_attr): INIT after the route (or the
// request) is known, RTR and RTS once the peer's QP number is known. Note
// that MinRNRTimer comes back as 0 (a 655 ms RNR back-off): override it, and
// trim the mask to what the QP type accepts. INIT before Connect has access
// flags 0: the active side applies INIT again (INIT to INIT) once
// CONNECT_RESPONSE came. Before Accept, MaxDestRdAtomic and MaxQPRdAtomic
// are the request's, not what Accept will grant (see MoveParams).
func (id *ID) InitQPAttr(state verbs.QPState) (verbs.QPAttr, verbs.QPAttrMask, error) {
	const op = "rdma_init_qp_attr"
	unlock, err := id.use(op)
	if err != nil {
		return verbs.QPAttr{}, 0, err
	}
	defer unlock()
	attr, mask, err := id.sysInitQPAttr(state)
	if err != nil {
		return verbs.QPAttr{}, 0, id.opErr(op, err, state.String)
	}
	return attr, mask, nil
}

// MoveQP moves qp, the QP of this connection, to state (INIT, RTR or RTS)
// through each state between, with the attributes the CM computes: what
// InitQPAttr and verbs.QP.Modify do step by step, in one C call, with p's
// values in place of the CM's (see MoveParams). At RTS a transport retry
// count over RetryCountFinite is lowered to it: the passive side's comes
// from the peer's request, and librdmacm's peers ask for 7, which soft-RoCE
// retries for ever.
// A QP already in state is left alone; one past it, or in SQD, SQE or ERR,
// gives EINVAL. A QP in INIT moving on takes INIT's attributes again first,
// as librdmacm does when a REP comes: a dialer's QP moved to INIT before
// rdma_connect got access flags 0 (no IB CM connection existed yet), which
// let the peer neither read nor write its memory.
// librdmacm makes the same calls itself, inside rdma_accept and its
// CONNECT_RESPONSE handling, for QPs made by rdma_create_qp. Connected ids
// only (RC, XRC): a datagram id's attributes (UD) fit INIT alone, and
// MoveQP refuses it with EINVAL; take its INIT from InitQPAttr.
func (id *ID) MoveQP(qp *verbs.QP, state verbs.QPState, p MoveParams) error {
	const op = "rdma_init_qp_attr"
	unlock, err := id.use(op)
	if err != nil {
		return err
	}
	defer unlock()
	if id.ud() {
		return &verbs.OpError{Op: op, Addr: "a UD id", Err: syscall.EINVAL}
	}
	if state < verbs.QPStateInit || state > verbs.QPStateRTS {
		return &verbs.OpError{Op: op, Addr: state.String(), Err: syscall.EINVAL}
	}
	modify := cbridge.ModifyQP
	if modify == nil {
		return &verbs.OpError{Op: op, Err: ErrNotSupported}
	}
	return modify(qp, func(h unsafe.Pointer, cur int) (int, error) {
		from := verbs.QPState(cur)
		if from > state {
			return cur, id.opErr("ibv_modify_qp", syscall.EINVAL, func() string { return from.String() + " to " + state.String() })
		}
		reached, failed, err := id.sysMoveQP(h, from, state, p)
		return reached, id.opErr(failed, err, state.String)
	})
}

// DeviceName returns the name of the RDMA device the id is bound to, or ""
// before the id is bound to one (or after Close).
func (id *ID) DeviceName() string { return readID(id, id.sysDeviceName) }

// Port returns the device port the id is bound to, or 0.
func (id *ID) Port() uint8 { return readID(id, id.sysPort) }

// LocalAddr returns the id's local address (rdma_get_local_addr).
func (id *ID) LocalAddr() netip.AddrPort { return readID(id, id.sysLocalAddr) }

// RemoteAddr returns the id's peer address (rdma_get_peer_addr).
func (id *ID) RemoteAddr() netip.AddrPort { return readID(id, id.sysRemoteAddr) }

// Pending returns how many events are queued for the id.
func (id *ID) Pending() int {
	if id == nil || id.ch == nil {
		return 0
	}
	return id.q.len()
}

// Event returns the id's next event, in the order the CM reported them,
// waiting until ctx ends. It fails with ErrClosed after Close of the id, or
// of the channel once the queued events are consumed. When ctx ends first it
// returns a *verbs.OpError wrapping ctx.Err() (a timeout for a deadline).
func (id *ID) Event(ctx context.Context) (Event, error) {
	return id.event(ctx, "rdma_get_cm_event", "")
}

func (id *ID) event(ctx context.Context, op, addr string) (Event, error) {
	if id == nil || id.ch == nil {
		return Event{}, &verbs.OpError{Op: op, Addr: addr, Err: ErrClosed}
	}
	e, err := id.q.pop(ctx)
	if oe, ok := err.(*verbs.OpError); ok && oe.Op == op {
		return Event{}, err // the broken channel's, which names the call already
	}
	if err != nil {
		return Event{}, &verbs.OpError{Op: op, Addr: addr, Err: err}
	}
	return e, nil
}

// WaitEvent returns the next event if it is want. Otherwise it returns the
// event together with an error: a *RejectError for REJECTED and
// UNREACHABLE; a *verbs.OpError carrying the errno for ADDR_ERROR,
// ROUTE_ERROR, CONNECT_ERROR and DEVICE_REMOVAL; an *UnexpectedEventError for
// anything else. Waiting errors are as in Event.
func (id *ID) WaitEvent(ctx context.Context, want EventType) (Event, error) {
	return id.wait(ctx, want, "wait "+want.String(), "")
}

func (id *ID) wait(ctx context.Context, want EventType, op, addr string) (Event, error) {
	e, err := id.event(ctx, op, addr)
	if err != nil {
		return e, err
	}
	if e.Type == want {
		return e, nil
	}
	return e, eventError(e, want, addr)
}

func errnoOf(status int) error {
	if status < 0 {
		return syscall.Errno(-status)
	}
	return errors.New("status " + strconv.Itoa(status))
}

// eventError turns an event other than the awaited one into an error.
func eventError(e Event, want EventType, addr string) error {
	switch e.Type {
	case EventRejected, EventUnreachable:
		return &RejectError{Type: e.Type, Status: e.Status, UD: e.ID != nil && e.ID.ud(), PrivateData: e.PrivateData}
	case EventAddrError:
		return &verbs.OpError{Op: "rdma_resolve_addr", Addr: addr, Err: errnoOf(e.Status)}
	case EventRouteError:
		return &verbs.OpError{Op: "rdma_resolve_route", Addr: addr, Err: errnoOf(e.Status)}
	case EventConnectError:
		return &verbs.OpError{Op: "rdma_connect", Addr: addr, Err: errnoOf(e.Status)}
	case EventDeviceRemoval:
		return &verbs.OpError{Op: "rdmacm", Addr: addr, Err: syscall.ENODEV}
	}
	return &UnexpectedEventError{Want: want, Event: e}
}

// Close destroys the CM id (rdma_destroy_id): an established connection is
// sent a DREQ (except from an XRC target id, which sends nothing), a pending
// request is rejected. Queued events are dropped, and the new ids of
// unclaimed connection requests on a listener are closed too. Waiters return
// ErrClosed. If rdma_destroy_id fails, the id is closed for use but still
// exists in C: it stays counted (Counts) and holds its channel, and Close
// may be called again to retry the destroy. Close is idempotent.
func (id *ID) Close() error {
	if id == nil || id.ch == nil {
		return nil
	}
	id.mu.Lock()
	if id.destroyed {
		id.mu.Unlock()
		return nil
	}
	var rest []Event
	c := id.ch
	if !id.closed {
		id.closed = true
		c.mu.Lock()
		delete(c.ids, id.handle) // the pump drops this id's events from now on
		c.mu.Unlock()
		rest = id.q.close(ErrClosed, true)
	}
	var addr string
	err := faults.Check("rdma_destroy_id")
	if err == nil {
		err = id.sysDestroy()
	}
	if err != nil {
		addr = id.sysLocalAddr().String()
	} else {
		id.destroyed = true
	}
	id.mu.Unlock()
	for _, e := range rest {
		if e.Type == EventConnectRequest && e.ID != nil && e.ID != id {
			e.ID.Close()
		}
	}
	if err != nil {
		return &verbs.OpError{Op: "rdma_destroy_id", Addr: addr, Err: err}
	}
	c.mu.Lock()
	c.live--
	liveIDs.Destroyed(id)
	destroy := c.destroyLocked()
	c.mu.Unlock()
	if destroy {
		c.sysDestroy()
	}
	return nil
}
