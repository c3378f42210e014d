//go:build linux && cgo

package verbs

/*
#cgo LDFLAGS: -libverbs
#include "cverbs.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/goxrc/goxrc/internal/faults"
	"github.com/goxrc/goxrc/internal/fdpoll"
)

// cAlloc returns n zeroed elements of size bytes in C memory, or nil.
func cAlloc(n int, size uintptr) unsafe.Pointer {
	if n <= 0 {
		n = 1
	}
	return C.calloc(C.size_t(n), C.size_t(size))
}

// cParts carves zeroed C arrays out of one calloc. Set-up paths use it
// instead of one calloc per array: on an emulated CPU every C call, and
// every fresh heap page a big array touches, is expensive.
type cParts struct {
	size uintptr
	offs []uintptr
}

// add reserves n elements of size bytes, 16-byte aligned, and returns the
// part's index for at.
func (p *cParts) add(n int, size uintptr) int {
	p.size = (p.size + 15) &^ 15
	p.offs = append(p.offs, p.size)
	p.size += uintptr(max(n, 0)) * size
	return len(p.offs) - 1
}

// alloc returns the block (free it with cFree) or nil.
func (p *cParts) alloc() unsafe.Pointer { return C.calloc(1, C.size_t(max(p.size, 1))) }

// at returns part i of block.
func (p *cParts) at(block unsafe.Pointer, i int) unsafe.Pointer {
	return unsafe.Add(block, p.offs[i])
}

// hexNum and hexAddr format numbers for object tags (error messages) without
// fmt: tags are built on every set-up, and fmt costs there (guest profiles).
func hexNum(n uint32) string          { return "0x" + strconv.FormatUint(uint64(n), 16) }
func hexAddr(p unsafe.Pointer) string { return "0x" + strconv.FormatUint(uint64(uintptr(p)), 16) }

// cAddr passes a pointer to C memory as an integer, which cgo does not
// check for Go pointers (see goxrc_poll in cverbs.h). Only for C memory.
func cAddr(p unsafe.Pointer) C.uintptr_t { return C.uintptr_t(uintptr(p)) }

func cFree(p unsafe.Pointer) {
	if p != nil {
		C.free(p)
	}
}

// CompChannel is a completion channel: the file descriptor through which a
// CQ's notifications arrive. Package verbs waits on it in the netpoller.
//
// A channel from NewCompChannel serves one CQ, which CQ.Wait sleeps on. A
// channel from NewSharedCompChannel serves any number of CQs: one goroutine
// reads their events with GetEvents and wakes whoever owns each CQ, so many
// CQs cost one descriptor and one netpoller registration.
type CompChannel struct {
	l  lifecycle
	c  *Context
	ch *C.struct_ibv_comp_channel

	bindMu sync.Mutex
	cq     *CQ // the one CQ bound to this channel (not shared)

	// A shared channel's reader state.
	shared  bool
	fd      *fdpoll.FD
	waitSem chan struct{} // one GetEvents at a time
	evMu    sync.Mutex
	dead    bool              // set by Close: readEvents reads no more
	cbuf    **C.struct_ibv_cq // C scratch for goxrc_get_any_cq_events
	want    []*CQ             // the caller's slice during GetEvents
	got     int
	readErr error
	read    func() bool // ch.readEvents, bound once so GetEvents does not allocate it
}

// NewCompChannel creates a completion channel. One channel serves one CQ.
func (c *Context) NewCompChannel() (*CompChannel, error) {
	if c == nil || c.ctx == nil || !c.l.ref() {
		return nil, closedErr("ibv_create_comp_channel", c.addr())
	}
	var ch *C.struct_ibv_comp_channel
	err := faults.Check("ibv_create_comp_channel")
	if err == nil {
		ch, err = C.ibv_create_comp_channel(c.ctx)
	}
	if ch == nil {
		c.l.unref()
		return nil, &OpError{Op: "ibv_create_comp_channel", Addr: c.name, Err: errnoOr(err, syscall.ENOMEM)}
	}
	cc := &CompChannel{c: c, ch: ch}
	live.channels.Created(cc)
	return cc, nil
}

// NewSharedCompChannel creates a completion channel for any number of CQs.
// CQ.Wait does not work on its CQs: read their events with GetEvents, and
// arm each CQ with ReqNotify.
func (c *Context) NewSharedCompChannel() (*CompChannel, error) {
	ch, err := c.NewCompChannel()
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*CompChannel, error) {
		C.ibv_destroy_comp_channel(ch.ch)
		live.channels.Destroyed(ch)
		c.l.unref()
		return nil, &OpError{Op: "ibv_create_comp_channel", Addr: c.name, Err: err}
	}
	ch.cbuf = (**C.struct_ibv_cq)(cAlloc(eventBatch, unsafe.Sizeof((*C.struct_ibv_cq)(nil))))
	if ch.cbuf == nil {
		return fail(syscall.ENOMEM)
	}
	fd, err := fdpoll.Open(int(C.goxrc_channel_fd(ch.ch)), c.name+" shared completion channel")
	if err != nil {
		cFree(unsafe.Pointer(ch.cbuf))
		return fail(err)
	}
	ch.shared, ch.fd, ch.waitSem = true, fd, make(chan struct{}, 1)
	ch.read = ch.readEvents
	return ch, nil
}

// takeTurn fills sem, the one-slot turn of CQ.Wait or GetEvents, waiting
// for it until ctx ends. A free turn is taken even if ctx has ended, so that
// a wait whose ctx was live when it began always looks at the CQ or channel
// (select would pick between the two at random): a caller may take its
// deadline's error for an empty CQ (xrc's receive loop does).
func takeTurn(ctx context.Context, sem chan struct{}) error {
	select {
	case sem <- struct{}{}:
		return nil
	default:
	}
	select {
	case sem <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// eventBatch bounds how many events one read of a shared channel takes.
const eventBatch = 64

// GetEvents waits until CQs of a shared channel have events, acknowledges
// the events and stores the CQs in cqs (a CQ may appear more than once), and
// returns how many it stored. Each CQ that had an event is disarmed until
// its next ReqNotify. The wait sleeps in the netpoller; it returns ctx's
// error when ctx ends first (events already there are taken even with an
// ended ctx, as CQ.Wait takes completions) and ErrClosed once the channel
// is closed.
// Concurrent calls take turns. With a context that can never end it does
// not allocate.
func (ch *CompChannel) GetEvents(ctx context.Context, cqs []*CQ) (int, error) {
	if ch == nil || ch.ch == nil {
		return 0, closedErr("get CQ events", "")
	}
	if !ch.l.use() {
		return 0, closedErr("get CQ events", ch.c.name)
	}
	ch.l.done()
	if !ch.shared {
		return 0, &OpError{Op: "get CQ events", Addr: ch.c.name, Err: &explained{syscall.EINVAL, "the channel serves one CQ: use CQ.Wait (or make it with NewSharedCompChannel)"}}
	}
	if len(cqs) == 0 {
		return 0, &OpError{Op: "get CQ events", Addr: ch.c.name, Err: &explained{syscall.EINVAL, "no room for CQs"}}
	}
	if err := takeTurn(ctx, ch.waitSem); err != nil {
		return 0, &OpError{Op: "get CQ events", Addr: ch.c.name, Err: err}
	}
	defer func() { <-ch.waitSem }()
	for {
		if !ch.l.use() {
			return 0, closedErr("get CQ events", ch.c.name)
		}
		fd := ch.fd // a Close that failed replaced it
		ch.l.done()
		n, err := ch.getEvents(ctx, fd, cqs)
		if err == errChannelClosed {
			if ch.reopened(fd) {
				continue
			}
			return 0, closedErr("get CQ events", ch.c.name)
		}
		return n, err
	}
}

// errChannelClosed: a Close came during getEvents.
var errChannelClosed = errors.New("channel closed")

// getEvents is one GetEvents wait on fd.
func (ch *CompChannel) getEvents(ctx context.Context, fd *fdpoll.FD, cqs []*CQ) (int, error) {
	ch.want, ch.got = cqs, 0
	err := fd.Wait(ctx, ch.read)
	n := ch.got
	ch.want, ch.got = nil, 0
	if ch.readErr != nil {
		err, ch.readErr = ch.readErr, nil
		return 0, &OpError{Op: "ibv_get_cq_event", Addr: ch.c.name, Err: err}
	}
	if err != nil {
		if errors.Is(err, fdpoll.ErrClosed) {
			return 0, errChannelClosed
		}
		return 0, &OpError{Op: "get CQ events", Addr: ch.c.name, Err: err}
	}
	if n == 0 { // the channel was closed under the read
		return 0, errChannelClosed
	}
	return n, nil
}

// readEvents reads queued events into ch.want and reports whether it has
// any (or an error, or the channel died).
func (ch *CompChannel) readEvents() bool {
	ch.evMu.Lock()
	defer ch.evMu.Unlock()
	if ch.dead {
		return true
	}
	for {
		limit := min(len(ch.want)-ch.got, eventBatch)
		n, err := C.goxrc_get_any_cq_events(ch.ch, ch.cbuf, C.int(limit))
		if n < 0 {
			ch.readErr = errnoOr(err, syscall.EIO)
			return true
		}
		ch.c.reg.mu.Lock()
		for _, p := range unsafe.Slice(ch.cbuf, int(n)) {
			// A CQ closed since its event was queued is gone from the
			// registry; its event is simply dropped.
			if q := ch.c.reg.cqs[p]; q != nil {
				q.armed.Store(false)
				ch.want[ch.got] = q
				ch.got++
			}
		}
		ch.c.reg.mu.Unlock()
		if ch.got > 0 {
			return true
		}
		if int(n) < limit {
			return false // drained: sleep until the descriptor is readable
		}
	}
}

// revive undoes what a Close did before its ibv_destroy_comp_channel
// failed (see CQ.revive). Called under the write lock.
func (ch *CompChannel) revive() {
	if !ch.shared {
		return
	}
	ch.evMu.Lock()
	ch.dead = false
	ch.evMu.Unlock()
	if fd, err := fdpoll.Open(int(C.goxrc_channel_fd(ch.ch)), ch.c.name+" shared completion channel"); err == nil {
		ch.fd = fd
	}
}

// reopened: see CQ.reopened.
func (ch *CompChannel) reopened(old *fdpoll.FD) bool {
	if !ch.l.use() {
		return false
	}
	defer ch.l.done()
	return ch.fd != old
}

// Close destroys the channel, waking a GetEvents (which returns ErrClosed);
// it fails with EBUSY while CQs on the channel are open. If the C destroy
// fails, the channel stays open and usable. Close is idempotent.
func (ch *CompChannel) Close() error {
	if ch == nil || ch.ch == nil {
		return nil
	}
	already, err := ch.l.beginClose("ibv_destroy_comp_channel", ch.c.name, "CQ")
	if already || err != nil {
		return err
	}
	if ch.shared {
		// Wakes the reader; after dead is set no read starts.
		ch.fd.Close()
		ch.evMu.Lock()
		ch.dead = true
		ch.evMu.Unlock()
	}
	err = faults.Check("ibv_destroy_comp_channel")
	if err == nil {
		if rc, cerr := C.ibv_destroy_comp_channel(ch.ch); rc != 0 {
			err = rcErr(rc, cerr)
		}
	}
	if err != nil {
		ch.revive()
		ch.l.endClose(false)
		return &OpError{Op: "ibv_destroy_comp_channel", Addr: ch.c.name, Err: err}
	}
	ch.l.endClose(true)
	if ch.shared {
		cFree(unsafe.Pointer(ch.cbuf))
	}
	live.channels.Destroyed(ch)
	ch.c.l.unref()
	return nil
}

// pollBatch bounds one ibv_poll_cq call; Poll returns at most this many.
const pollBatch = 256

// ackBatch is how many CQ events accumulate before ibv_ack_cq_events:
// acking takes a mutex in libibverbs, so do it rarely (and always on Close).
const ackBatch = 64

// CQ is a completion queue.
type CQ struct {
	l   lifecycle
	c   *Context
	cq  *C.struct_ibv_cq
	ch  *CompChannel
	fd  *fdpoll.FD // nil without a channel
	tag string

	pollMu  sync.Mutex
	scratch unsafe.Pointer // C block holding tmp, out, other and armRC
	tmp     *C.struct_ibv_wc
	out     []C.struct_goxrc_wc // C memory

	waitSem  chan struct{} // one Wait at a time: fdpoll deadlines are per fd
	armed    atomic.Bool
	evMu     sync.Mutex
	dead     bool // set by Close: drainEvents reads no more
	unacked  C.uint
	other    *C.int      // C scratch for goxrc_get_cq_events
	armRC    *C.int      // C scratch for goxrc_poll_arm, under pollMu
	drain    func() bool // q.drainEvents, bound once so Wait does not allocate it
	drainErr error       // a failed channel read; set by drainEvents under waitSem
	cqe      int
}

// CreateCQ creates a completion queue with room for at least cqe entries.
// With a channel, Wait can sleep until completions arrive; vector picks the
// completion interrupt vector (0 is always valid).
func (c *Context) CreateCQ(cqe int, ch *CompChannel, vector int) (*CQ, error) {
	if c == nil || c.ctx == nil || !c.l.ref() {
		return nil, closedErr("ibv_create_cq", c.addr())
	}
	fail := func(err error) (*CQ, error) {
		c.l.unref()
		return nil, err
	}
	if cqe <= 0 || cqe > math.MaxInt32 { // C.int would wrap
		return fail(&OpError{Op: "ibv_create_cq", Addr: c.name, Err: &explained{syscall.EINVAL, fmt.Sprintf("cqe %d", cqe)}})
	}
	if vector < 0 || vector > math.MaxInt32 {
		return fail(&OpError{Op: "ibv_create_cq", Addr: c.name, Err: &explained{syscall.EINVAL, fmt.Sprintf("completion vector %d", vector)}})
	}
	q := &CQ{c: c, ch: ch, waitSem: make(chan struct{}, 1)}
	var cch *C.struct_ibv_comp_channel
	if ch != nil {
		if !sameDevice(c, ch.c) {
			return fail(&OpError{Op: "ibv_create_cq", Addr: c.name, Err: &explained{syscall.EINVAL, "completion channel belongs to another device"}})
		}
		if ch.ch == nil || !ch.l.ref() {
			return fail(closedErr("ibv_create_cq", c.name+" (channel)"))
		}
		ch.bindMu.Lock()
		busy := ch.cq != nil
		if !busy && !ch.shared {
			ch.cq = q
		}
		ch.bindMu.Unlock()
		if busy {
			ch.l.unref()
			return fail(&OpError{Op: "ibv_create_cq", Addr: c.name, Err: &explained{syscall.EBUSY, "completion channel already serves a CQ; create one channel per CQ"}})
		}
		cch = ch.ch
	}
	unbind := func() {
		if ch != nil {
			ch.unbind()
		}
	}
	var cq *C.struct_ibv_cq
	err := faults.Check("ibv_create_cq")
	if err == nil {
		cq, err = C.ibv_create_cq(c.ctx, C.int(cqe), nil, cch, C.int(vector))
	}
	if cq == nil {
		unbind()
		return fail(&OpError{Op: "ibv_create_cq", Addr: c.name, Err: errnoOr(err, syscall.ENOMEM)})
	}
	q.cq = cq
	q.cqe = int(C.goxrc_cq_cqe(cq))
	q.tag = c.name + " cq " + hexAddr(unsafe.Pointer(cq))
	// One poll never returns more than the CQ holds: a small CQ (a
	// connection's) gets small arrays.
	batch := min(max(q.cqe, 1), pollBatch)
	var parts cParts
	tmp, out, other := parts.add(batch, unsafe.Sizeof(C.struct_ibv_wc{})), parts.add(batch, unsafe.Sizeof(C.struct_goxrc_wc{})), parts.add(1, unsafe.Sizeof(C.int(0)))
	armRC := parts.add(1, unsafe.Sizeof(C.int(0)))
	if q.scratch = parts.alloc(); q.scratch == nil {
		C.ibv_destroy_cq(cq)
		unbind()
		return fail(&OpError{Op: "ibv_create_cq", Addr: c.name, Err: syscall.ENOMEM})
	}
	q.tmp = (*C.struct_ibv_wc)(parts.at(q.scratch, tmp))
	q.out = unsafe.Slice((*C.struct_goxrc_wc)(parts.at(q.scratch, out)), batch)
	q.other = (*C.int)(parts.at(q.scratch, other))
	q.armRC = (*C.int)(parts.at(q.scratch, armRC))
	if ch != nil && !ch.shared {
		fd, err := fdpoll.Open(int(C.goxrc_channel_fd(cch)), q.tag+" channel")
		if err != nil {
			cFree(q.scratch)
			C.ibv_destroy_cq(cq)
			unbind()
			return fail(&OpError{Op: "ibv_create_cq", Addr: c.name, Err: err})
		}
		q.fd = fd
	}
	q.drain = q.drainEvents
	c.reg.mu.Lock()
	c.reg.cqs[cq] = q
	c.reg.mu.Unlock()
	live.cqs.Created(q)
	return q, nil
}

func (q *CQ) addr() string {
	if q == nil {
		return ""
	}
	return q.tag
}

// CQE returns the queue's actual capacity (at least what was asked for).
func (q *CQ) CQE() int {
	if q == nil {
		return 0
	}
	return q.cqe
}

// Poll copies up to len(wcs) completions into wcs (at most 256, and at most
// CQE, per call) and returns how many. It makes one C call and does not
// allocate.
func (q *CQ) Poll(wcs []WorkCompletion) (int, error) {
	if q == nil || q.cq == nil || !q.l.use() {
		return 0, closedErr("ibv_poll_cq", q.addr())
	}
	n, err := q.poll(wcs)
	q.l.done()
	return n, err
}

// PollSpin is Poll that keeps polling, inside one C call, until it finds a
// completion or spin has passed. It is a busy-polling loop's body: the loop
// gets back to Go, to check its context or deadline, once per spin. Keep
// spin short (tens of microseconds): Close waits for a spin under way.
func (q *CQ) PollSpin(wcs []WorkCompletion, spin time.Duration) (int, error) {
	if q == nil || q.cq == nil || !q.l.use() {
		return 0, closedErr("ibv_poll_cq", q.addr())
	}
	n, err := q.pollFor(wcs, spin, nil, false)
	q.l.done()
	return n, err
}

// PollOrArm is Poll that, finding nothing, arms the CQ (ReqNotify for any
// completion) and polls once more, in one C call: the last look of a wait
// before it sleeps until the channel's event. armed reports whether it
// armed the CQ (then an event will come, whatever the second poll found).
func (q *CQ) PollOrArm(wcs []WorkCompletion) (n int, armed bool, err error) {
	if q == nil || q.cq == nil || !q.l.use() {
		return 0, false, closedErr("ibv_poll_cq", q.addr())
	}
	defer q.l.done()
	return q.pollOrArm(wcs)
}

// poll runs with q read-locked.
func (q *CQ) poll(wcs []WorkCompletion) (int, error) { return q.pollFor(wcs, 0, nil, false) }

// pollOrArm runs with q read-locked.
func (q *CQ) pollOrArm(wcs []WorkCompletion) (int, bool, error) {
	if min(len(wcs), len(q.out)) == 0 {
		err := q.arm(false)
		return 0, err == nil, err
	}
	var armed bool
	n, err := q.pollFor(wcs, 0, &armed, false)
	return n, armed, err
}

// pollFor runs with q read-locked; it spins up to spin for a completion.
// With armed set it arms the CQ instead when nothing is there, and sets
// *armed if it did (pollOrArm); with unlessArmed as well, only if the CQ is
// not armed already (Wait). The armed flag is read and set under pollMu,
// as arm sets it: a reader outside it could see it set for an arm that
// then found completions and did not happen.
func (q *CQ) pollFor(wcs []WorkCompletion, spin time.Duration, armed *bool, unlessArmed bool) (int, error) {
	n := min(len(wcs), len(q.out))
	if n == 0 {
		return 0, nil
	}
	q.pollMu.Lock()
	var got int
	if armed != nil && !(unlessArmed && q.armed.Load()) {
		// Set before the arm: the event it raises may be read (and the
		// flag cleared) on another goroutine before the C call returns,
		// and a flag set after that would say armed of a disarmed CQ.
		q.armed.Store(true)
		got = int(C.goxrc_poll_arm(cAddr(unsafe.Pointer(q.cq)), C.int(n), q.tmp, &q.out[0], q.armRC))
		switch rc := *q.armRC; rc {
		case C.GOXRC_NOT_ARMED:
			q.armed.Store(false)
		case 0:
			*armed = true
		default:
			q.armed.Store(false)
			q.pollMu.Unlock()
			return 0, &OpError{Op: "ibv_req_notify_cq", Addr: q.tag, Err: rcErr(rc, nil)}
		}
	} else {
		got = int(C.goxrc_poll_spin(cAddr(unsafe.Pointer(q.cq)), C.int(n), q.tmp, &q.out[0], C.int64_t(spin)))
	}
	for i := 0; i < got; i++ {
		o := &q.out[i]
		wcs[i] = WorkCompletion{
			WRID:      uint64(o.wr_id),
			Status:    WCStatus(o.status),
			Opcode:    WCOpcode(o.opcode),
			VendorErr: uint32(o.vendor_err),
			ByteLen:   uint32(o.byte_len),
			Imm:       uint32(o.imm),
			QPNum:     uint32(o.qp_num),
			SrcQP:     uint32(o.src_qp),
			Flags:     WCFlags(o.wc_flags),
			SLID:      uint16(o.slid),
			SL:        uint8(o.sl),
		}
	}
	q.pollMu.Unlock()
	if got < 0 {
		// A negative count is the driver's own code, not an errno (mlx5's
		// -2 is CQ_POLL_ERR, not ENOENT).
		return 0, &OpError{Op: "ibv_poll_cq", Addr: q.tag, Err: &explained{syscall.EIO, fmt.Sprintf("the driver's poll failed (%d)", got)}}
	}
	return got, nil
}

// ReqNotify arms the CQ: the next completion (or the next solicited one)
// raises one event on the channel. Wait arms by itself; call this only when
// reading the channel some other way.
func (q *CQ) ReqNotify(solicitedOnly bool) error {
	if q == nil || q.cq == nil || !q.l.use() {
		return closedErr("ibv_req_notify_cq", q.addr())
	}
	defer q.l.done()
	return q.arm(solicitedOnly)
}

func (q *CQ) arm(solicitedOnly bool) error {
	s := C.int(0)
	if solicitedOnly {
		s = 1
	}
	q.pollMu.Lock()
	defer q.pollMu.Unlock()
	// Before the arm, as in pollFor. Not for solicited completions only:
	// Wait, taking the CQ for armed, would sleep through the others.
	if !solicitedOnly {
		q.armed.Store(true)
	}
	if err := faults.Check("ibv_req_notify_cq"); err != nil {
		q.armed.Store(false)
		return &OpError{Op: "ibv_req_notify_cq", Addr: q.tag, Err: err}
	}
	if rc := C.goxrc_req_notify(q.cq, s); rc != 0 {
		q.armed.Store(false)
		return &OpError{Op: "ibv_req_notify_cq", Addr: q.tag, Err: rcErr(rc, nil)}
	}
	return nil
}

// drainEvents reads every queued channel event (the netpoller is
// edge-triggered) and reports whether one was for this CQ.
func (q *CQ) drainEvents() bool {
	// evMu covers the read too: fdpoll calls this once before it holds the
	// fd, so Close cannot rely on closing the fd to keep it out. Close sets
	// dead under evMu; after that no event is read that it would not ack,
	// and ibv_destroy_cq never waits for one.
	q.evMu.Lock()
	defer q.evMu.Unlock()
	if q.dead {
		return true
	}
	n, err := C.goxrc_get_cq_events(q.ch.ch, q.cq, q.other)
	if n < 0 {
		q.drainErr = errnoOr(err, syscall.EIO)
		return true
	}
	if n == 0 {
		return false
	}
	q.armed.Store(false)
	q.unacked += C.uint(n)
	if q.unacked >= ackBatch {
		C.ibv_ack_cq_events(q.cq, q.unacked)
		q.unacked = 0
	}
	return true
}

// Wait returns completions, sleeping in the netpoller until some arrive. It
// polls; if nothing is there it arms the CQ and polls again (a completion
// may have slipped in before the arming); only then does it wait for the
// channel. It returns ctx's error when ctx ends first (wrapped in an
// *OpError; errors.Is(err, context.DeadlineExceeded) holds) and ErrClosed
// once the CQ is closed. The CQ needs a completion channel. Concurrent Waits
// on one CQ take turns.
func (q *CQ) Wait(ctx context.Context, wcs []WorkCompletion) (int, error) {
	if q == nil || q.cq == nil {
		return 0, closedErr("wait CQ", q.addr())
	}
	if !q.l.use() { // closed: say so before what else is wrong
		return 0, closedErr("wait CQ", q.tag)
	}
	hasFD := q.fd != nil
	q.l.done()
	if !hasFD {
		why := "CQ was created without a completion channel"
		if q.ch != nil {
			why = "the CQ's completion channel is shared: read its events with CompChannel.GetEvents"
		}
		return 0, &OpError{Op: "wait CQ", Addr: q.tag, Err: &explained{syscall.EINVAL, why}}
	}
	if len(wcs) == 0 {
		return 0, &OpError{Op: "wait CQ", Addr: q.tag, Err: &explained{syscall.EINVAL, "no room for completions"}}
	}
	if err := takeTurn(ctx, q.waitSem); err != nil {
		return 0, &OpError{Op: "wait CQ", Addr: q.tag, Err: err}
	}
	defer func() { <-q.waitSem }()
	for {
		if !q.l.use() {
			return 0, closedErr("wait CQ", q.tag)
		}
		fd := q.fd // a Close that failed replaced it
		var n int
		var err error
		var armed bool // the flag is read under pollMu
		n, err = q.pollFor(wcs, 0, &armed, true)
		q.l.done()
		if n > 0 || err != nil {
			return n, err
		}
		err = fd.Wait(ctx, q.drain)
		if q.drainErr != nil {
			err, q.drainErr = q.drainErr, nil
			return 0, &OpError{Op: "ibv_get_cq_event", Addr: q.tag, Err: err}
		}
		if err != nil {
			if errors.Is(err, fdpoll.ErrClosed) {
				if q.reopened(fd) {
					continue
				}
				return 0, closedErr("wait CQ", q.tag)
			}
			return 0, &OpError{Op: "wait CQ", Addr: q.tag, Err: err}
		}
	}
}

// revive undoes what a Close did before its ibv_destroy_cq failed: the CQ
// stays open, so events are read again and a Wait that the Close woke
// waits on (CQ.reopened). Called under the write lock.
func (q *CQ) revive() {
	q.evMu.Lock()
	q.dead = false
	q.evMu.Unlock()
	if q.fd == nil {
		return
	}
	if fd, err := fdpoll.Open(int(C.goxrc_channel_fd(q.ch.ch)), q.tag+" channel"); err == nil {
		q.fd = fd
	} // else Wait fails with ErrClosed, as it would have before
}

// reopened reports whether old, closed under a Wait, was replaced by a
// Close that failed (revive): the CQ is open and the Wait goes on.
func (q *CQ) reopened(old *fdpoll.FD) bool {
	if !q.l.use() {
		return false
	}
	defer q.l.done()
	return q.fd != old
}

// Close destroys the CQ, waking any Wait (which returns ErrClosed). It fails
// with EBUSY while QPs or SRQs use the CQ. If the C destroy fails, the CQ
// stays open and usable, its Waits still waiting. Close is idempotent.
func (q *CQ) Close() error {
	if q == nil || q.cq == nil {
		return nil
	}
	already, err := q.l.beginClose("ibv_destroy_cq", q.tag, "QPs and SRQs using it")
	if already || err != nil {
		return err
	}
	if q.fd != nil {
		// Wakes a waiter (it does not wait for a drainEvents under way:
		// dead, set under evMu below, keeps drainEvents out from then on).
		q.fd.Close()
	}
	q.evMu.Lock()
	q.dead = true
	if q.unacked > 0 {
		// ibv_destroy_cq waits until every event it handed out is acked.
		C.ibv_ack_cq_events(q.cq, q.unacked)
		q.unacked = 0
	}
	q.evMu.Unlock()
	if err := faults.Check("ibv_destroy_cq"); err != nil {
		q.revive()
		q.l.endClose(false)
		return &OpError{Op: "ibv_destroy_cq", Addr: q.tag, Err: err}
	}
	if rc, cerr := C.ibv_destroy_cq(q.cq); rc != 0 {
		q.revive()
		q.l.endClose(false)
		return &OpError{Op: "ibv_destroy_cq", Addr: q.tag, Err: rcErr(rc, cerr)}
	}
	cFree(q.scratch)
	q.c.reg.mu.Lock()
	if q.c.reg.cqs[q.cq] == q { // else a new CQ got the freed address
		delete(q.c.reg.cqs, q.cq)
	}
	q.c.reg.mu.Unlock()
	q.l.endClose(true)
	live.cqs.Destroyed(q)
	if q.ch != nil {
		q.ch.unbind()
	}
	q.c.l.unref()
	return nil
}

// unbind forgets a CQ of the channel.
func (ch *CompChannel) unbind() {
	ch.bindMu.Lock()
	if !ch.shared {
		ch.cq = nil
	}
	ch.bindMu.Unlock()
	ch.l.unref()
}
