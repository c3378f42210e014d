//go:build linux && cgo

package verbs

/*
#cgo LDFLAGS: -libverbs
#include "cverbs.h"
*/
import "C"

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/goxrc/goxrc/internal/cbridge"
	"github.com/goxrc/goxrc/internal/faults"
	"github.com/goxrc/goxrc/internal/fdpoll"
)

func init() {
	cbridge.WrapContext = func(p unsafe.Pointer) any {
		if p == nil {
			return nil // not a typed nil inside a non-nil interface
		}
		return wrapContext((*C.struct_ibv_context)(p))
	}
	cbridge.QPAttrFromC = func(p unsafe.Pointer) any { return qpAttrFromC((*C.struct_ibv_qp_attr)(p)) }
	cbridge.AHAttrFromC = func(p unsafe.Pointer) any { return ahAttrFromC((*C.struct_ibv_ah_attr)(p)) }
	cbridge.ModifyQP = func(q any, move func(unsafe.Pointer, int) (int, error)) error {
		return q.(*QP).modifyOutside(move)
	}
}

// errnoOr returns err when the C call set errno, def otherwise: some
// providers return NULL without setting it.
func errnoOr(err error, def syscall.Errno) error {
	var e syscall.Errno
	if errors.As(err, &e) && e != 0 {
		return e
	}
	return def
}

// rcErr turns the return conventions of libibverbs into an error: a
// positive errno, -1 with errno set, or a negative errno (some providers'
// post calls, siw's among them, return -ENOMEM for a full queue).
func rcErr(rc C.int, err error) error { return returnErr(int(rc), err) }

func returnErr(rc int, err error) error {
	switch {
	case rc == 0:
		return nil
	case rc > 0:
		return syscall.Errno(rc)
	case rc < -1:
		return syscall.Errno(-rc)
	}
	return errnoOr(err, syscall.EIO)
}

// be64 converts a __be64 read as a native integer to its numeric value.
func be64(v uint64) uint64 {
	var b [8]byte
	binary.NativeEndian.PutUint64(b[:], v)
	return binary.BigEndian.Uint64(b[:])
}

// Devices lists the RDMA devices of this host. Where the kernel has no RDMA
// support at all it returns an error matching ErrNotSupported.
//
// The command-line equivalent is `ibv_devices` (or `rdma dev show`).
func Devices() ([]DeviceInfo, error) {
	var n C.int
	list, err := C.ibv_get_device_list(&n)
	if list == nil {
		return nil, noDevicesErr(err)
	}
	defer C.ibv_free_device_list(list)
	devs := unsafe.Slice(list, int(n))
	out := make([]DeviceInfo, 0, len(devs))
	for _, d := range devs {
		out = append(out, DeviceInfo{
			Name:      C.GoString(C.ibv_get_device_name(d)),
			NodeGUID:  be64(uint64(C.ibv_get_device_guid(d))),
			Transport: Transport(d.transport_type),
		})
	}
	return out, nil
}

func noDevicesErr(err error) error {
	e := errnoOr(err, syscall.ENOSYS).(syscall.Errno)
	if e == syscall.ENOSYS {
		return &OpError{Op: "ibv_get_device_list", Err: &explained{e, "no RDMA support in this kernel (no uverbs devices)"}}
	}
	return &OpError{Op: "ibv_get_device_list", Err: e}
}

// Context is an open RDMA device (struct ibv_context).
type Context struct {
	l     lifecycle
	ctx   *C.struct_ibv_context
	name  string
	owned bool // false for contexts librdmacm owns (cbridge.WrapContext)

	asyncOnce sync.Once
	async     atomic.Pointer[asyncSub] // this wrapper's share of the context's async events; AsyncErr reads it unlocked

	reg *registry
}

// registry maps one C device context's CQs and SRQs to their Go objects,
// for the readers of completion channels and async events. Every wrapper of
// the context shares it (librdmacm's context may be wrapped more than once:
// cbridge.WrapContext), so a CQ made through one wrapper on a channel made
// through another is found by that channel's reader.
type registry struct {
	mu    sync.Mutex
	srqs  map[*C.struct_ibv_srq]*SRQ
	cqs   map[*C.struct_ibv_cq]*CQ
	users int // open wrappers; guarded by registries

	asyncMu sync.Mutex
	async   *asyncPump // the context's one async fd reader, while it has subscribers
	// retiring is the done of the pump that the last unsubscribe is
	// stopping, until it has stopped: no new pump starts before it has.
	retiring chan struct{}
}

// registries holds the registry of every C context with an open wrapper.
var registries struct {
	sync.Mutex
	m map[*C.struct_ibv_context]*registry
}

func acquireRegistry(c *C.struct_ibv_context) *registry {
	registries.Lock()
	defer registries.Unlock()
	r := registries.m[c]
	if r == nil {
		if registries.m == nil {
			registries.m = map[*C.struct_ibv_context]*registry{}
		}
		r = &registry{srqs: map[*C.struct_ibv_srq]*SRQ{}, cqs: map[*C.struct_ibv_cq]*CQ{}}
		registries.m[c] = r
	}
	r.users++
	return r
}

// releaseRegistry drops a closed wrapper's use; the last one forgets the
// registry, before the C context can be closed and its address reused.
func releaseRegistry(c *C.struct_ibv_context) {
	registries.Lock()
	defer registries.Unlock()
	if r := registries.m[c]; r != nil {
		if r.users--; r.users == 0 {
			delete(registries.m, c)
		}
	}
}

// OpenDevice opens the device called name. An unknown name gives an
// *OpError wrapping ENODEV; where the kernel has no RDMA support at all the
// error matches ErrNotSupported as well, as Devices' does.
func OpenDevice(name string) (*Context, error) {
	var n C.int
	list, err := C.ibv_get_device_list(&n)
	if list == nil {
		return nil, &OpError{Op: "open device", Addr: name, Err: &noDeviceList{noDevicesErr(err)}}
	}
	defer C.ibv_free_device_list(list)
	for _, d := range unsafe.Slice(list, int(n)) {
		if C.GoString(C.ibv_get_device_name(d)) != name {
			continue
		}
		c, err := C.ibv_open_device(d)
		if c == nil {
			return nil, &OpError{Op: "ibv_open_device", Addr: name, Err: errnoOr(err, syscall.ENODEV)}
		}
		ctx := newContext(c, name, true)
		return ctx, nil
	}
	return nil, &OpError{Op: "open device", Addr: name, Err: &explained{syscall.ENODEV, "no such RDMA device"}}
}

// noDeviceList is OpenDevice's error where there is no device list: ENODEV
// (errors.As finds it first), and why there is no list, which on a kernel
// without RDMA (ENOSYS) matches ErrNotSupported, as Devices' error does.
type noDeviceList struct{ why error }

func (e *noDeviceList) Error() string {
	return "no such RDMA device: " + e.why.Error() + " (" + syscall.ENODEV.Error() + ")"
}

func (e *noDeviceList) Unwrap() []error { return []error{syscall.ENODEV, e.why} }

func newContext(c *C.struct_ibv_context, name string, owned bool) *Context {
	ctx := &Context{ctx: c, name: name, owned: owned, reg: acquireRegistry(c)}
	live.contexts.Created(ctx)
	return ctx
}

// wrapContext wraps a context that librdmacm owns: Close stops the Go side
// (the event pump) but never closes the device.
func wrapContext(c *C.struct_ibv_context) *Context {
	if c == nil {
		return nil
	}
	return newContext(c, C.GoString(C.ibv_get_device_name(c.device)), false)
}

func (c *Context) addr() string {
	if c == nil {
		return ""
	}
	return c.name
}

// use read-locks c for one call; nil and closed contexts give ErrClosed.
func (c *Context) use(op string) error {
	if c == nil || c.ctx == nil || !c.l.use() {
		return closedErr(op, c.addr())
	}
	return nil
}

// Name returns the device name, e.g. "rxe0" or "mlx5_0".
func (c *Context) Name() string { return c.addr() }

// QueryDevice returns the device's attributes and limits.
//
// The command-line equivalent is `ibv_devinfo -d DEV -v` (the lines
// before its ports).
func (c *Context) QueryDevice() (DeviceAttr, error) {
	if err := c.use("ibv_query_device"); err != nil {
		return DeviceAttr{}, err
	}
	defer c.l.done()
	var a C.struct_ibv_device_attr
	if rc, err := C.ibv_query_device(c.ctx, &a); rc != 0 {
		return DeviceAttr{}, &OpError{Op: "ibv_query_device", Addr: c.name, Err: rcErr(rc, err)}
	}
	return DeviceAttr{
		FWVersion:       C.GoString(&a.fw_ver[0]),
		NodeGUID:        be64(uint64(a.node_guid)),
		SysImageGUID:    be64(uint64(a.sys_image_guid)),
		MaxMRSize:       uint64(a.max_mr_size),
		PageSizeCap:     uint64(a.page_size_cap),
		VendorID:        uint32(a.vendor_id),
		VendorPartID:    uint32(a.vendor_part_id),
		HWVersion:       uint32(a.hw_ver),
		MaxQP:           int(a.max_qp),
		MaxQPWR:         int(a.max_qp_wr),
		CapFlags:        DeviceCap(a.device_cap_flags),
		MaxSGE:          int(a.max_sge),
		MaxSGERd:        int(a.max_sge_rd),
		MaxCQ:           int(a.max_cq),
		MaxCQE:          int(a.max_cqe),
		MaxMR:           int(a.max_mr),
		MaxPD:           int(a.max_pd),
		MaxQPRdAtom:     int(a.max_qp_rd_atom),
		MaxQPInitRdAtom: int(a.max_qp_init_rd_atom),
		MaxSRQ:          int(a.max_srq),
		MaxSRQWR:        int(a.max_srq_wr),
		MaxSRQSGE:       int(a.max_srq_sge),
		AtomicCap:       AtomicCap(a.atomic_cap),
		PhysPortCnt:     int(a.phys_port_cnt),
	}, nil
}

// QueryPort returns the attributes of port (numbered from 1).
//
// The command-line equivalent is `ibv_devinfo -d DEV -i PORT -v`; the
// state is also in `rdma link show DEV/PORT`.
func (c *Context) QueryPort(port uint8) (PortAttr, error) {
	if err := c.use("ibv_query_port"); err != nil {
		return PortAttr{}, err
	}
	defer c.l.done()
	var a C.struct_ibv_port_attr
	if rc, err := C.goxrc_query_port(c.ctx, C.uint8_t(port), &a); rc != 0 {
		return PortAttr{}, &OpError{Op: "ibv_query_port", Addr: fmt.Sprintf("%s port %d", c.name, port), Err: rcErr(rc, err)}
	}
	return PortAttr{
		State:        PortState(a.state),
		MaxMTU:       MTU(a.max_mtu),
		ActiveMTU:    MTU(a.active_mtu),
		GIDTableLen:  int(a.gid_tbl_len),
		PKeyTableLen: int(a.pkey_tbl_len),
		MaxMsgSize:   uint32(a.max_msg_sz),
		LID:          uint16(a.lid),
		SMLID:        uint16(a.sm_lid),
		LinkLayer:    LinkLayer(a.link_layer),
		ActiveSpeed:  uint8(a.active_speed),
		ActiveWidth:  uint8(a.active_width),
	}, nil
}

// GIDs returns the valid entries of port's GID table, with their RoCE type
// and network device.
//
// Like the GID lines of `ibv_devinfo -d DEV -i PORT -v`; the network device
// is in sysfs, /sys/class/infiniband/DEV/ports/PORT/gid_attrs/ndevs/INDEX.
func (c *Context) GIDs(port uint8) ([]GIDEntry, error) {
	pa, err := c.QueryPort(port)
	if err != nil {
		return nil, err
	}
	if err := c.use("ibv_query_gid_table"); err != nil {
		return nil, err
	}
	defer c.l.done()
	// The table call covers every port and returns valid entries only; the
	// kernel takes the reply size in a 16-bit attribute length, so at most
	// 2047 entries of 32 bytes fit in one call.
	max := min(pa.GIDTableLen*4, 2047)
	if max == 0 {
		return nil, nil
	}
	buf := C.calloc(C.size_t(max), C.size_t(unsafe.Sizeof(C.struct_ibv_gid_entry{})))
	if buf == nil {
		return nil, &OpError{Op: "ibv_query_gid_table", Addr: c.name, Err: syscall.ENOMEM}
	}
	defer C.free(buf)
	n := C.goxrc_query_gid_table(c.ctx, (*C.struct_ibv_gid_entry)(buf), C.size_t(max))
	if n < 0 {
		// A negative errno, as libibverbs documents; errno itself may be
		// left over from its fallback's reads of sysfs.
		return nil, &OpError{Op: "ibv_query_gid_table", Addr: c.name, Err: syscall.Errno(-n)}
	}
	var out []GIDEntry
	for _, e := range unsafe.Slice((*C.struct_ibv_gid_entry)(buf), int(n)) {
		if uint8(e.port_num) != port {
			continue
		}
		g := GIDEntry{Index: int(e.gid_index), Type: GIDType(e.gid_type)}
		copy(g.GID[:], C.GoBytes(unsafe.Pointer(&e.gid), 16))
		if e.ndev_ifindex != 0 {
			if ifi, err := net.InterfaceByIndex(int(e.ndev_ifindex)); err == nil {
				g.Netdev = ifi.Name
			}
		}
		out = append(out, g)
	}
	return out, nil
}

// AsyncEvents returns the device's asynchronous events (QP errors, SRQ limit,
// port changes ...). The device context has one async descriptor, however
// many wrappers it has (rdmacm.ID.VerbsContext makes one per call): its first
// AsyncEvents starts one pump goroutine that waits for the descriptor in the
// netpoller, copies and acknowledges each event, and delivers it to every
// wrapper that called AsyncEvents, each on its own channel. The channel is
// closed by the wrapper's Close, which first ends the deliveries to it (so
// a reader never gets an event after a dropped one), or early if reading
// the descriptor fails (AsyncErr says why). Events wait in the kernel while a reader's channel
// is full, so a reader that falls behind loses nothing, and holds back the
// others. Every call on a wrapper returns the same channel; nil if the pump
// cannot start (AsyncErr says why).
//
// Like `ibv_asyncwatch -d DEV`, for the device's own events (port and GID
// changes): a QP's, CQ's or SRQ's events reach only the context owning it.
func (c *Context) AsyncEvents() <-chan AsyncEvent {
	if err := c.use("async events"); err != nil {
		return nil
	}
	defer c.l.done()
	c.asyncOnce.Do(func() { c.async.Store(c.reg.subscribeAsync(c)) })
	if s := c.async.Load(); s.ch != nil {
		return s.ch
	}
	return nil
}

// AsyncErr reports why AsyncEvents returned nil, or why its channel closed
// before Close: the async descriptor could not be polled or read.
func (c *Context) AsyncErr() error {
	if c == nil {
		return nil
	}
	s := c.async.Load()
	if s == nil {
		return nil
	}
	err := s.err.Load()
	if err == nil {
		return nil
	}
	return &OpError{Op: "ibv_get_async_event", Addr: c.name, Err: *err}
}

// asyncPump reads one C context's async descriptor for all its wrappers.
type asyncPump struct {
	c    *Context // the wrapper that started it: its C context and registry
	fd   *fdpoll.FD
	done chan struct{}
	subs map[*asyncSub]struct{} // under registry.asyncMu
}

// asyncSub is one wrapper's channel of async events.
type asyncSub struct {
	ch   chan AsyncEvent
	stop chan struct{}         // closed by unsubscribeAsync: the pump stops sending
	mu   sync.Mutex            // held by the pump while it sends
	dead bool                  // ch is closed; under mu
	err  atomic.Pointer[error] // why the pump ended early, or could not start
}

// offer hands ev to s's reader, waiting while its channel is full, unless
// s's Close has begun (stop is closed): from then on nothing is delivered.
// The stop is looked at first: a select over both, with room in the
// channel, delivered or dropped each event read during the Close at
// random, so the reader could get an event after a dropped earlier one.
// The pump calls it under s.mu.
func (s *asyncSub) offer(ev AsyncEvent) {
	select {
	case <-s.stop:
		return
	default:
	}
	select {
	case s.ch <- ev:
	case <-s.stop:
	}
}

// end closes s's channel (once), err the reason if not nil.
func (s *asyncSub) end(err error) {
	if err != nil {
		s.err.CompareAndSwap(nil, &err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.dead {
		s.dead = true
		close(s.ch)
	}
}

// subscribeAsync adds a subscriber for c, starting the pump if there is none.
//
// A pump that the last unsubscribe is stopping (r.async nil, r.retiring
// set) may still be reading: its wait is woken, but its try drains the
// descriptor until EAGAIN and hands each event to its subscribers, none by
// now. A second pump started beside it would read the same C context's
// events, and those the old one took would be lost to the new subscriber.
// So a new pump starts only once the old one has returned (its done is
// closed after its last read), and the subscriber waits for that without
// asyncMu, which the old pump takes for each event. Hence every event read
// after s is in a pump's subs is read by that pump and offered to s; the
// retiring pump's reads all came before s was registered.
func (r *registry) subscribeAsync(c *Context) *asyncSub {
	s := &asyncSub{stop: make(chan struct{})}
	r.asyncMu.Lock()
	defer r.asyncMu.Unlock()
	for r.async == nil && r.retiring != nil {
		done := r.retiring
		r.asyncMu.Unlock()
		<-done
		r.asyncMu.Lock()
		if r.retiring == done {
			r.retiring = nil
		}
	}
	if r.async == nil {
		fd, err := fdpoll.Open(int(C.goxrc_async_fd(c.ctx)), c.name+" async fd")
		if err != nil {
			s.err.Store(&err)
			return s
		}
		r.async = &asyncPump{c: c, fd: fd, done: make(chan struct{}), subs: map[*asyncSub]struct{}{}}
		go r.pumpAsync(r.async)
	}
	s.ch = make(chan AsyncEvent, 64)
	r.async.subs[s] = struct{}{}
	return s
}

// unsubscribeAsync removes s; the last subscriber stops the pump.
func (r *registry) unsubscribeAsync(s *asyncSub) {
	if s == nil || s.ch == nil {
		return
	}
	close(s.stop)
	r.asyncMu.Lock()
	p := r.async
	var last bool
	if p != nil {
		if _, ok := p.subs[s]; ok {
			delete(p.subs, s)
			last = len(p.subs) == 0
			if last {
				r.async = nil
				r.retiring = p.done // see subscribeAsync
			}
		}
	}
	r.asyncMu.Unlock()
	if last {
		p.fd.Close() // wakes the pump; does not wait for its try
		<-p.done
		r.asyncMu.Lock()
		if r.retiring == p.done {
			r.retiring = nil
		}
		r.asyncMu.Unlock()
	}
	s.end(nil)
}

func (r *registry) pumpAsync(p *asyncPump) {
	defer close(p.done)
	var raw C.struct_goxrc_async
	var readErr error
	var subs []*asyncSub
	err := p.fd.Wait(context.Background(), func() bool {
		// Drain everything: the netpoller is edge-triggered.
		for {
			switch rc, err := C.goxrc_get_async(p.c.ctx, &raw); rc {
			case 0:
				return false
			case -1:
				readErr = errnoOr(err, syscall.EIO)
				return true
			}
			// Looked up before the ack: the CQ or SRQ it names cannot
			// be destroyed until then, nor its address taken by a new one
			// that the event would then be reported for.
			if err := faults.Check("ibv_get_async_event"); err != nil {
				C.goxrc_ack_async(&raw)
				readErr = err
				return true
			}
			ev := p.c.convertAsync(&raw)
			C.goxrc_ack_async(&raw)
			r.asyncMu.Lock()
			subs = subs[:0]
			for s := range p.subs {
				subs = append(subs, s)
			}
			r.asyncMu.Unlock()
			for _, s := range subs {
				s.mu.Lock()
				if !s.dead {
					s.offer(ev)
				}
				s.mu.Unlock()
			}
		}
	})
	if readErr == nil && !errors.Is(err, fdpoll.ErrClosed) {
		readErr = err
	}
	if readErr == nil {
		return // stopped by the last unsubscribe
	}
	// Reading failed: every subscriber's channel ends with the reason, and
	// the next AsyncEvents of a new wrapper starts a new pump.
	r.asyncMu.Lock()
	if r.async == p {
		r.async = nil
	}
	subs = subs[:0]
	for s := range p.subs {
		subs = append(subs, s)
	}
	p.subs = nil
	r.asyncMu.Unlock()
	p.fd.Close()
	for _, s := range subs {
		s.end(readErr)
	}
}

func (c *Context) convertAsync(raw *C.struct_goxrc_async) AsyncEvent {
	ev := AsyncEvent{Type: AsyncEventType(raw._type), QPNum: uint32(raw.qp_num), Port: uint8(raw.port)}
	c.reg.mu.Lock()
	if raw.srq != nil {
		ev.SRQ = c.reg.srqs[raw.srq]
		if ev.SRQ != nil {
			ev.SRQNum = ev.SRQ.num
		}
	}
	if raw.cq != nil {
		ev.CQ = c.reg.cqs[raw.cq]
	}
	c.reg.mu.Unlock()
	return ev
}

// Close closes the device. It fails with EBUSY while PDs, CQs, completion
// channels or XRC domains of this context are open: close those first.
// Close is idempotent.
func (c *Context) Close() error {
	if c == nil || c.ctx == nil {
		return nil
	}
	already, err := c.l.beginClose("ibv_close_device", c.name, "PDs, CQs, channels and XRC domains")
	if already || err != nil {
		return err
	}
	c.reg.unsubscribeAsync(c.async.Load())
	releaseRegistry(c.ctx)
	if c.owned {
		if rc, cerr := C.ibv_close_device(c.ctx); rc != 0 {
			// The Go side is gone already; report, but the context is closed.
			c.l.endClose(true)
			live.contexts.Destroyed(c)
			return &OpError{Op: "ibv_close_device", Addr: c.name, Err: rcErr(rc, cerr)}
		}
	}
	c.l.endClose(true)
	live.contexts.Destroyed(c)
	return nil
}
