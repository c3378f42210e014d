//go:build linux && cgo

package verbs

/*
#cgo LDFLAGS: -libverbs
#include "cverbs.h"
*/
import "C"

import (
	"fmt"
	"slices"
	"sync"
	"syscall"
	"unsafe"

	"github.com/goxrc/goxrc/internal/faults"
)

// maxChain bounds the scratch arrays of one queue: a chain longer than the
// queue itself could not be posted anyway.
const maxChain = 1024

// maxInlineArena bounds the C memory kept per QP for inline payloads.
const maxInlineArena = 64 << 10

// sendScratch is C memory a QP's PostSend fills and hands to C in one call.
// cgo forbids passing Go memory that holds Go pointers, and allocating per
// call would put the data path on the garbage collector.
type sendScratch struct {
	mu    sync.Mutex
	block unsafe.Pointer // one C block holding the arrays below
	in    []C.struct_goxrc_swr
	wr    *C.struct_ibv_send_wr
	sges  []C.struct_ibv_sge
	inl   []byte // inline arena
	bad   *C.int
	// ahs holds the AHs of the chain being posted (UD), each in use until
	// the post returns: the driver reads them inside ibv_post_send.
	ahs []*AH
}

func (s *sendScratch) alloc(chain, sge, inline int) bool {
	var p cParts
	in, wr := p.add(chain, unsafe.Sizeof(C.struct_goxrc_swr{})), p.add(chain, unsafe.Sizeof(C.struct_ibv_send_wr{}))
	sg, bad, inl := p.add(sge, unsafe.Sizeof(C.struct_ibv_sge{})), p.add(1, unsafe.Sizeof(C.int(0))), p.add(inline, 1)
	if s.block = p.alloc(); s.block == nil {
		return false
	}
	s.in = unsafe.Slice((*C.struct_goxrc_swr)(p.at(s.block, in)), chain)
	s.wr = (*C.struct_ibv_send_wr)(p.at(s.block, wr))
	s.sges = unsafe.Slice((*C.struct_ibv_sge)(p.at(s.block, sg)), sge)
	s.bad = (*C.int)(p.at(s.block, bad))
	if inline > 0 {
		s.inl = unsafe.Slice((*byte)(p.at(s.block, inl)), inline)
	}
	return true
}

func (s *sendScratch) free() {
	cFree(s.block)
	// Not *s = sendScratch{}: that would reset the held mutex.
	s.block, s.in, s.wr, s.sges, s.inl, s.bad = nil, nil, nil, nil, nil, nil
}

// recvScratch is the receive-side counterpart; ibv_recv_wr has no unions, so
// Go fills it directly.
type recvScratch struct {
	mu    sync.Mutex
	block unsafe.Pointer // one C block holding the arrays below
	wrs   []C.struct_ibv_recv_wr
	sges  []C.struct_ibv_sge
	bad   *C.int
}

func (r *recvScratch) alloc(chain, sge int) bool {
	var p cParts
	w, sg, bad := p.add(chain, unsafe.Sizeof(C.struct_ibv_recv_wr{})), p.add(sge, unsafe.Sizeof(C.struct_ibv_sge{})), p.add(1, unsafe.Sizeof(C.int(0)))
	if r.block = p.alloc(); r.block == nil {
		return false
	}
	r.wrs = unsafe.Slice((*C.struct_ibv_recv_wr)(p.at(r.block, w)), chain)
	r.sges = unsafe.Slice((*C.struct_ibv_sge)(p.at(r.block, sg)), sge)
	r.bad = (*C.int)(p.at(r.block, bad))
	return true
}

func (r *recvScratch) free() {
	cFree(r.block)
	r.block, r.wrs, r.sges, r.bad = nil, nil, nil, nil
}

// fill copies wrs into the scratch arrays and links them. Call with r.mu held.
func (r *recvScratch) fill(wrs []RecvWR) error {
	if len(wrs) > len(r.wrs) {
		return &PostError{Index: len(r.wrs), Err: &explained{syscall.EINVAL,
			fmt.Sprintf("chain of %d work requests exceeds the queue's %d", len(wrs), len(r.wrs))}}
	}
	off := 0
	for i := range wrs {
		w := &wrs[i]
		if off+len(w.SGL) > len(r.sges) {
			return &PostError{Index: i, Err: &explained{syscall.EINVAL, "too many SGEs in the chain"}}
		}
		c := &r.wrs[i]
		c.wr_id = C.uint64_t(w.ID)
		c.num_sge = C.int(len(w.SGL))
		c.sg_list = nil
		if len(w.SGL) > 0 {
			c.sg_list = &r.sges[off]
		}
		for j, g := range w.SGL {
			r.sges[off+j] = C.struct_ibv_sge{addr: C.uint64_t(g.Addr), length: C.uint32_t(g.Length), lkey: C.uint32_t(g.LKey)}
		}
		off += len(w.SGL)
		if i+1 < len(wrs) {
			c.next = &r.wrs[i+1]
		} else {
			c.next = nil
		}
	}
	return nil
}

func chainSize(depth uint32) int {
	return max(1, min(int(depth), maxChain))
}

// QP is a queue pair, or a shared handle on an XRC target QP (OpenQP).
type QP struct {
	l    lifecycle
	c    *Context
	qp   *C.struct_ibv_qp
	typ  QPType
	num  uint32
	tag  string
	deps []*lifecycle // objects this QP holds a reference on
	cap  QPCap
	srq  bool
	// opened: a handle from OpenQP, which providers give no queues and
	// no doorbell record (see Modify).
	opened bool

	stateMu    sync.Mutex
	state      QPState
	stateKnown bool

	send sendScratch
	recv recvScratch
}

// sameDevice reports whether the objects' contexts are c's device context.
// It compares C contexts, not wrappers: librdmacm hands out one ibv_context
// per device, which may be wrapped more than once (cbridge.WrapContext).
func sameDevice(c *Context, objs ...*Context) bool {
	for _, o := range objs {
		if o != nil && o.ctx != c.ctx {
			return false
		}
	}
	return true
}

func initErr(tag, why string) error {
	return &OpError{Op: "ibv_create_qp_ex", Addr: tag, Err: &explained{syscall.EINVAL, why}}
}

// validateQPInit checks the combination of objects for the QP type before
// any C call, so that a wrong combination gives a sentence, not EINVAL.
func validateQPInit(tag string, in *QPInit) error {
	caps := in.Cap
	switch in.Type {
	case QPTypeRC, QPTypeUC, QPTypeUD:
		if in.SendCQ == nil {
			return initErr(tag, in.Type.String()+" QP needs a send CQ")
		}
		if in.XRCD != nil {
			return initErr(tag, in.Type.String()+" QP takes no XRC domain")
		}
		if in.SRQ != nil {
			if in.SRQ.xrcd != nil {
				return initErr(tag, "an XRC SRQ cannot serve an "+in.Type.String()+" QP")
			}
			if caps.MaxRecvWR != 0 || caps.MaxRecvSGE != 0 {
				return initErr(tag, "a QP with an SRQ has no receive queue: leave MaxRecvWR and MaxRecvSGE 0")
			}
		}
	case QPTypeXRCSend:
		if in.SendCQ == nil {
			return initErr(tag, "XRC_SEND QP needs a send CQ")
		}
		if in.RecvCQ != nil || in.SRQ != nil || in.XRCD != nil {
			return initErr(tag, "XRC_SEND QP is send-only: no receive CQ, SRQ or XRC domain")
		}
		if caps.MaxRecvWR != 0 || caps.MaxRecvSGE != 0 {
			return initErr(tag, "XRC_SEND QP is send-only: leave MaxRecvWR and MaxRecvSGE 0")
		}
	case QPTypeXRCRecv:
		if in.XRCD == nil {
			return initErr(tag, "XRC_RECV QP needs an XRC domain")
		}
		if in.SendCQ != nil || in.RecvCQ != nil || in.SRQ != nil {
			return initErr(tag, "XRC_RECV QP takes only an XRC domain: no CQs, no SRQ (it delivers into the domain's XRC SRQs)")
		}
		if caps != (QPCap{}) {
			return initErr(tag, "XRC_RECV QP has no queues of its own: leave Cap zero")
		}
	default:
		return &OpError{Op: "ibv_create_qp_ex", Addr: tag, Err: &explained{syscall.EOPNOTSUPP, "QP type " + in.Type.String() + " is not supported by this package"}}
	}
	return nil
}

// CreateQP creates a queue pair; see QPInit for what each type takes.
// RecvCQ defaults to SendCQ for RC, UC and UD.
func (p *PD) CreateQP(init QPInit) (*QP, error) {
	if p == nil || p.pd == nil {
		return nil, closedErr("ibv_create_qp_ex", p.addr())
	}
	if init.Type == QPTypeXRCRecv {
		// The PD is not used, but a closed one creates nothing (a check
		// only: createQP read-locks the Context, and holding the PD across
		// that would order the two locks against createQP's own PD ref).
		if !p.l.use() {
			return nil, closedErr("ibv_create_qp_ex", p.tag)
		}
		p.l.done()
		if init.XRCD != nil && !sameDevice(p.c, init.XRCD.c) {
			return nil, initErr(p.tag, "XRC domain belongs to another device")
		}
		return p.c.createQP(nil, init)
	}
	return p.c.createQP(p, init)
}

// CreateXRCRecvQP creates an XRC target (TGT) QP in the domain. The creator
// holds one handle like any OpenQP caller; the QP lives until the last
// handle is closed.
func (c *Context) CreateXRCRecvQP(xrcd *XRCD) (*QP, error) {
	return c.createQP(nil, QPInit{Type: QPTypeXRCRecv, XRCD: xrcd})
}

func (c *Context) createQP(pd *PD, init QPInit) (*QP, error) {
	tag := c.addr()
	// A closed wrapper creates nothing, even where the objects given (an
	// XRC domain of another wrapper of the same C context) are open.
	if c == nil || c.ctx == nil || !c.l.use() {
		return nil, closedErr("ibv_create_qp_ex", tag)
	}
	defer c.l.done()
	if init.Type != QPTypeXRCRecv && init.RecvCQ == nil && init.Type != QPTypeXRCSend {
		init.RecvCQ = init.SendCQ
	}
	if err := validateQPInit(tag, &init); err != nil {
		return nil, err
	}
	var dc []*Context
	for _, o := range []interface{ ctxOf() *Context }{init.SendCQ, init.RecvCQ, init.SRQ, init.XRCD} {
		if o != nil {
			dc = append(dc, o.ctxOf())
		}
	}
	if !sameDevice(c, dc...) {
		return nil, initErr(tag, "CQs, SRQ and XRC domain must belong to the QP's device")
	}
	q := &QP{c: c, typ: init.Type, srq: init.SRQ != nil}
	// Take references first: from here on nothing it uses can be freed.
	var a C.struct_ibv_qp_init_attr_ex
	take := func(l *lifecycle) bool {
		if !l.ref() {
			return false
		}
		q.deps = append(q.deps, l)
		return true
	}
	ok := true
	if pd != nil {
		ok = pd.pd != nil && take(&pd.l)
		a.comp_mask |= C.IBV_QP_INIT_ATTR_PD
		a.pd = pd.pd
	}
	if ok && init.SendCQ != nil {
		ok = init.SendCQ.cq != nil && take(&init.SendCQ.l)
		a.send_cq = init.SendCQ.cq
	}
	if ok && init.RecvCQ != nil {
		ok = init.RecvCQ.cq != nil && take(&init.RecvCQ.l)
		a.recv_cq = init.RecvCQ.cq
	}
	if ok && init.SRQ != nil {
		ok = init.SRQ.srq != nil && take(&init.SRQ.l)
		a.srq = init.SRQ.srq
	}
	if ok && init.XRCD != nil {
		ok = init.XRCD.x != nil && take(&init.XRCD.l)
		a.comp_mask |= C.IBV_QP_INIT_ATTR_XRCD
		a.xrcd = init.XRCD.x
	}
	if !ok {
		q.release()
		return nil, closedErr("ibv_create_qp_ex", tag+" (a PD, CQ, SRQ or XRC domain given is closed)")
	}
	a.qp_type = C.enum_ibv_qp_type(init.Type)
	a.cap.max_send_wr = C.uint32_t(init.Cap.MaxSendWR)
	a.cap.max_recv_wr = C.uint32_t(init.Cap.MaxRecvWR)
	a.cap.max_send_sge = C.uint32_t(init.Cap.MaxSendSGE)
	a.cap.max_recv_sge = C.uint32_t(init.Cap.MaxRecvSGE)
	a.cap.max_inline_data = C.uint32_t(init.Cap.MaxInlineData)
	if init.SigAll {
		a.sq_sig_all = 1
	}
	var cqp *C.struct_ibv_qp
	err := faults.Check("ibv_create_qp_ex")
	if err == nil {
		cqp, err = C.goxrc_create_qp_ex(c.ctx, &a)
	}
	if cqp == nil {
		q.release()
		return nil, &OpError{Op: "ibv_create_qp_ex", Addr: tag + " " + init.Type.String(), Err: errnoOr(err, syscall.EINVAL)}
	}
	q.qp = cqp
	q.num = uint32(C.goxrc_qp_num(cqp))
	q.tag = c.name + " " + init.Type.String() + " QP " + hexNum(q.num)
	q.cap = QPCap{
		MaxSendWR:     uint32(a.cap.max_send_wr),
		MaxRecvWR:     uint32(a.cap.max_recv_wr),
		MaxSendSGE:    uint32(a.cap.max_send_sge),
		MaxRecvSGE:    uint32(a.cap.max_recv_sge),
		MaxInlineData: uint32(a.cap.max_inline_data),
	}
	q.stateKnown = true // a new QP is in RESET
	if err := q.allocScratch(); err != nil {
		C.ibv_destroy_qp(cqp)
		q.release()
		return nil, err
	}
	live.qps.Created(q)
	return q, nil
}

func (q *QP) allocScratch() error {
	if q.typ != QPTypeXRCRecv && q.cap.MaxSendWR > 0 {
		chain := chainSize(q.cap.MaxSendWR)
		inl := 0
		if q.cap.MaxInlineData > 0 {
			inl = min(chain*int(q.cap.MaxInlineData), maxInlineArena)
		}
		if !q.send.alloc(chain, chain*max(1, int(q.cap.MaxSendSGE)), inl) {
			return &OpError{Op: "ibv_create_qp_ex", Addr: q.tag, Err: syscall.ENOMEM}
		}
		if q.typ == QPTypeUD {
			q.send.ahs = make([]*AH, 0, chain)
		}
	}
	if !q.srq && q.typ != QPTypeXRCRecv && q.typ != QPTypeXRCSend && q.cap.MaxRecvWR > 0 {
		chain := chainSize(q.cap.MaxRecvWR)
		if !q.recv.alloc(chain, chain*max(1, int(q.cap.MaxRecvSGE))) {
			q.send.free()
			return &OpError{Op: "ibv_create_qp_ex", Addr: q.tag, Err: syscall.ENOMEM}
		}
	}
	return nil
}

func (q *QP) release() {
	for _, d := range q.deps {
		d.unref()
	}
	q.deps = nil
}

// OpenQP opens another handle on the XRC target QP numbered qpn in the
// domain (ibv_open_qp). Each handle counts: the target QP lives until its
// last handle is closed, in this or any process. The handle can be modified
// and queried but has no queues, and not moved to RESET (Modify). A freed QP
// number can be reused at once, so verify what was opened (Query) before
// trusting it.
func (c *Context) OpenQP(xrcd *XRCD, qpn uint32) (*QP, error) {
	tag := fmt.Sprintf("%s XRC_RECV QP %#x", c.addr(), qpn)
	if c == nil || c.ctx == nil || !c.l.use() {
		return nil, closedErr("ibv_open_qp", tag)
	}
	defer c.l.done()
	if xrcd == nil || xrcd.x == nil || !sameDevice(c, xrcd.c) {
		return nil, &OpError{Op: "ibv_open_qp", Addr: tag, Err: &explained{syscall.EINVAL, "needs an XRC domain of this device"}}
	}
	if !xrcd.l.ref() {
		return nil, closedErr("ibv_open_qp", tag+" (XRC domain)")
	}
	cqp, err := C.goxrc_open_qp(c.ctx, xrcd.x, C.uint32_t(qpn))
	if cqp == nil {
		xrcd.l.unref()
		return nil, &OpError{Op: "ibv_open_qp", Addr: tag, Err: errnoOr(err, syscall.EINVAL)}
	}
	q := &QP{c: c, qp: cqp, typ: QPTypeXRCRecv, num: qpn, tag: tag, deps: []*lifecycle{&xrcd.l}, opened: true}
	live.qps.Created(q)
	return q, nil
}

func (q *QP) addr() string {
	if q == nil {
		return ""
	}
	return q.tag
}

func (q *QP) use(op string) error {
	if q == nil || q.qp == nil || !q.l.use() {
		return closedErr(op, q.addr())
	}
	return nil
}

// Num returns the QP number; 0 for a nil QP.
func (q *QP) Num() uint32 {
	if q == nil {
		return 0
	}
	return q.num
}

// Type returns the QP type.
func (q *QP) Type() QPType {
	if q == nil {
		return 0
	}
	return q.typ
}

// Cap returns the queue sizes the device granted (at least those asked for).
func (q *QP) Cap() QPCap {
	if q == nil {
		return QPCap{}
	}
	return q.cap
}

// Modify changes the QP's attributes and state. The mask must fit the QP type
// and the transition (see RequiredMask and AllowedMask); otherwise Modify
// returns an *OpError wrapping a *MaskError without calling the driver.
// A handle from OpenQP cannot go to RESET (EINVAL): mlx5 clears the
// doorbell record of a QP it resets, which an opened handle does not have
// (mlx5_modify_qp writes through a NULL pointer).
func (q *QP) Modify(attr *QPAttr, mask QPAttrMask) error {
	if q != nil && q.opened && attr != nil && mask&QPAttrState != 0 && attr.State == QPStateReset {
		return &OpError{Op: "ibv_modify_qp", Addr: q.tag, Err: &explained{syscall.EINVAL, "an opened XRC target QP handle cannot go to RESET"}}
	}
	if err := q.use("ibv_modify_qp"); err != nil {
		return err
	}
	defer q.l.done()
	if attr == nil {
		return &OpError{Op: "ibv_modify_qp", Addr: q.tag, Err: &explained{syscall.EINVAL, "nil attributes"}}
	}
	q.stateMu.Lock()
	defer q.stateMu.Unlock()
	if err := q.learnStateLocked(); err != nil {
		return err
	}
	if err := CheckMask(q.typ, q.state, attr, mask); err != nil {
		return &OpError{Op: "ibv_modify_qp", Addr: q.tag, Err: err}
	}
	var ca C.struct_ibv_qp_attr
	qpAttrToC(attr, &ca)
	if err := faults.Check("ibv_modify_qp"); err != nil {
		return &OpError{Op: "ibv_modify_qp", Addr: q.tag, Err: err}
	}
	if rc, err := C.ibv_modify_qp(q.qp, &ca, C.int(mask)); rc != 0 {
		q.stateKnown = false // the driver may have moved it (to ERR, say)
		return &OpError{Op: "ibv_modify_qp", Addr: q.tag, Err: rcErr(rc, err)}
	}
	if mask&QPAttrState != 0 {
		q.state = attr.State
	}
	return nil
}

// learnStateLocked queries the QP's state when a failed modify left it
// unknown; stateMu is held.
func (q *QP) learnStateLocked() error {
	if q.stateKnown {
		return nil
	}
	var ca C.struct_ibv_qp_attr
	var ci C.struct_ibv_qp_init_attr
	if rc, err := C.ibv_query_qp(q.qp, &ca, C.IBV_QP_STATE, &ci); rc != 0 {
		return &OpError{Op: "ibv_query_qp", Addr: q.tag, Err: rcErr(rc, err)}
	}
	q.state, q.stateKnown = QPState(ca.qp_state), true
	return nil
}

// modifyOutside runs move, which changes the QP's state in C (see
// cbridge.ModifyQP), under the same lock and state bookkeeping as Modify.
func (q *QP) modifyOutside(move func(qp unsafe.Pointer, state int) (int, error)) error {
	const op = "ibv_modify_qp"
	if err := q.use(op); err != nil {
		return err
	}
	defer q.l.done()
	q.stateMu.Lock()
	defer q.stateMu.Unlock()
	if err := q.learnStateLocked(); err != nil {
		return err
	}
	reached, err := move(unsafe.Pointer(q.qp), int(q.state))
	if q.stateKnown = reached >= 0; q.stateKnown {
		q.state = QPState(reached)
	}
	return err
}

// Query returns the attributes selected by mask and the QP's queue sizes.
func (q *QP) Query(mask QPAttrMask) (QPAttr, QPCap, error) {
	if err := q.use("ibv_query_qp"); err != nil {
		return QPAttr{}, QPCap{}, err
	}
	defer q.l.done()
	var ca C.struct_ibv_qp_attr
	var ci C.struct_ibv_qp_init_attr
	if rc, err := C.ibv_query_qp(q.qp, &ca, C.int(mask), &ci); rc != 0 {
		return QPAttr{}, QPCap{}, &OpError{Op: "ibv_query_qp", Addr: q.tag, Err: rcErr(rc, err)}
	}
	attr := qpAttrFromC(&ca)
	if mask&QPAttrState != 0 {
		q.stateMu.Lock()
		q.state, q.stateKnown = attr.State, true
		q.stateMu.Unlock()
	}
	return attr, QPCap{
		MaxSendWR:     uint32(ci.cap.max_send_wr),
		MaxRecvWR:     uint32(ci.cap.max_recv_wr),
		MaxSendSGE:    uint32(ci.cap.max_send_sge),
		MaxRecvSGE:    uint32(ci.cap.max_recv_sge),
		MaxInlineData: uint32(ci.cap.max_inline_data),
	}, nil
}

// PostSend posts a chain of send work requests with one C call and no
// allocation. On failure the *OpError wraps a *PostError: Index is the
// request refused, Posted how many went (those before Index where the
// driver refused it, none where this package's checks refused the chain).
func (q *QP) PostSend(wrs []SendWR) error {
	if err := q.use("ibv_post_send"); err != nil {
		return err
	}
	defer q.l.done()
	s := &q.send
	if s.in == nil {
		return &OpError{Op: "ibv_post_send", Addr: q.tag, Err: &TypeError{Op: "PostSend", Type: q.typ, Why: "this QP has no send queue"}}
	}
	if len(wrs) == 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	defer s.releaseAHs()
	if err := q.fillSend(wrs); err != nil {
		return &OpError{Op: "ibv_post_send", Addr: q.tag, Err: err}
	}
	if rc := C.goxrc_post_send(cAddr(unsafe.Pointer(q.qp)), cAddr(unsafe.Pointer(&s.in[0])), cAddr(unsafe.Pointer(s.wr)), &s.sges[0], C.int(len(wrs)), s.bad); rc != 0 {
		return &OpError{Op: "ibv_post_send", Addr: q.tag, Err: &PostError{Index: int(*s.bad), Posted: int(*s.bad), Err: rcErr(rc, nil)}}
	}
	return nil
}

func (q *QP) fillSend(wrs []SendWR) error {
	s := &q.send
	if len(wrs) > len(s.in) {
		return &PostError{Index: len(s.in), Err: &explained{syscall.EINVAL,
			fmt.Sprintf("chain of %d work requests exceeds the send queue's %d", len(wrs), len(s.in))}}
	}
	sge, inl := 0, 0
	for i := range wrs {
		w := &wrs[i]
		in := &s.in[i]
		flags := w.Flags
		in.sge_off = C.uint32_t(sge)
		if len(w.Inline) > 0 {
			n := len(w.Inline)
			switch {
			case len(w.SGL) > 0:
				return &PostError{Index: i, Err: &explained{syscall.EINVAL, "Inline and SGL are exclusive"}}
			case n > int(q.cap.MaxInlineData):
				return &PostError{Index: i, Err: &explained{syscall.EINVAL, fmt.Sprintf("%d inline bytes exceed the QP's MaxInlineData %d", n, q.cap.MaxInlineData)}}
			case inl+n > len(s.inl) || sge >= len(s.sges):
				return &PostError{Index: i, Err: &explained{syscall.EINVAL, "inline data of the chain exceeds the QP's inline buffer"}}
			}
			copy(s.inl[inl:], w.Inline)
			s.sges[sge] = C.struct_ibv_sge{addr: C.uint64_t(uintptr(unsafe.Pointer(&s.inl[inl]))), length: C.uint32_t(n)}
			inl += (n + 7) &^ 7
			sge++
			in.num_sge = 1
			flags |= SendInline
		} else {
			if sge+len(w.SGL) > len(s.sges) {
				return &PostError{Index: i, Err: &explained{syscall.EINVAL, "too many SGEs in the chain"}}
			}
			for j, g := range w.SGL {
				s.sges[sge+j] = C.struct_ibv_sge{addr: C.uint64_t(g.Addr), length: C.uint32_t(g.Length), lkey: C.uint32_t(g.LKey)}
			}
			sge += len(w.SGL)
			in.num_sge = C.uint32_t(len(w.SGL))
		}
		if err := checkOpcode(q.typ, w.Opcode); err != nil {
			return &PostError{Index: i, Err: err}
		}
		in.wr_id = C.uint64_t(w.ID)
		in.opcode = C.uint32_t(w.Opcode)
		in.flags = C.uint32_t(flags)
		in.imm = C.uint32_t(w.Imm)
		in.remote_addr = C.uint64_t(w.RemoteAddr)
		in.rkey = C.uint32_t(w.RKey)
		in.compare_add = C.uint64_t(w.CompareAdd)
		in.swap = C.uint64_t(w.Swap)
		in.remote_srqn = C.uint32_t(w.RemoteSRQNum)
		in.remote_qpn = C.uint32_t(w.RemoteQPN)
		in.remote_qkey = C.uint32_t(w.RemoteQKey)
		in.ah = nil
		if q.typ == QPTypeUD {
			if w.AH == nil || w.AH.ah == nil || !s.holdAH(w.AH) {
				return &PostError{Index: i, Err: &explained{syscall.EINVAL, "UD send needs an open AH (not one being closed)"}}
			}
			if !sameDevice(q.c, w.AH.pd.c) {
				return &PostError{Index: i, Err: &explained{syscall.EINVAL, "the AH is of another device"}}
			}
			in.ah = w.AH.ah
		}
	}
	return nil
}

// holdAH keeps a in use until releaseAHs, once however many requests of
// the chain name it: a second read lock behind a waiting Close would
// deadlock. It does not wait for a Close under way (tryUse): the post
// already holds the QP and maybe other AHs.
func (s *sendScratch) holdAH(a *AH) bool {
	if slices.Contains(s.ahs, a) {
		return true
	}
	if !a.l.tryUse() {
		return false
	}
	s.ahs = append(s.ahs, a)
	return true
}

// releaseAHs ends the uses holdAH took on the chain's AHs.
func (s *sendScratch) releaseAHs() {
	for i, a := range s.ahs {
		a.l.done()
		s.ahs[i] = nil
	}
	s.ahs = s.ahs[:0]
}

// PostRecv posts a chain of receive work requests with one C call and no
// allocation. QPs that receive through an SRQ, and XRC QPs, have no receive
// queue: post to the SRQ instead.
func (q *QP) PostRecv(wrs []RecvWR) error {
	if err := q.use("ibv_post_recv"); err != nil {
		return err
	}
	defer q.l.done()
	r := &q.recv
	if r.wrs == nil {
		why := "this QP has no receive queue"
		if q.srq {
			why = "this QP receives through its SRQ: post there"
		}
		return &OpError{Op: "ibv_post_recv", Addr: q.tag, Err: &TypeError{Op: "PostRecv", Type: q.typ, Why: why}}
	}
	if len(wrs) == 0 {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.fill(wrs); err != nil {
		return &OpError{Op: "ibv_post_recv", Addr: q.tag, Err: err}
	}
	if rc := C.goxrc_post_recv(cAddr(unsafe.Pointer(q.qp)), cAddr(unsafe.Pointer(&r.wrs[0])), r.bad); rc != 0 {
		return &OpError{Op: "ibv_post_recv", Addr: q.tag, Err: &PostError{Index: int(*r.bad), Posted: int(*r.bad), Err: rcErr(rc, nil)}}
	}
	return nil
}

// Close destroys the QP (for an XRC target: this handle). Outstanding work
// requests are dropped; move the QP to ERR and drain its CQ first if their
// completions matter. Close is idempotent.
//
// A handle from OpenQP is destroyed in the kernel directly (the uverbs
// destroy command), not through the provider: mlx5 (rdma-core 40 and later,
// still so upstream) frees a doorbell record such a handle never had, whose
// lookup misses and, with asserts compiled out as in distributions' builds,
// writes through the lookup map's sentinel. The provider's small struct for
// the handle stays allocated.
func (q *QP) Close() error {
	if q == nil || q.qp == nil {
		return nil
	}
	already, err := q.l.beginClose("ibv_destroy_qp", q.tag, "")
	if already || err != nil {
		return err
	}
	// Wait out posts that already hold the scratch locks.
	q.send.mu.Lock()
	q.recv.mu.Lock()
	defer q.recv.mu.Unlock()
	defer q.send.mu.Unlock()
	if rc, cerr := q.destroy(); rc != 0 {
		q.l.endClose(false)
		return &OpError{Op: "ibv_destroy_qp", Addr: q.tag, Err: rcErr(rc, cerr)}
	}
	q.send.free()
	q.recv.free()
	q.release()
	q.l.endClose(true)
	live.qps.Destroyed(q)
	return nil
}

func (q *QP) destroy() (C.int, error) {
	if q.opened {
		rc, err := C.goxrc_destroy_qp_handle(q.qp)
		return rc, err
	}
	rc, err := C.ibv_destroy_qp(q.qp)
	return rc, err
}

// SRQ is a shared receive queue, basic or XRC.
type SRQ struct {
	l      lifecycle
	c      *Context
	srq    *C.struct_ibv_srq
	xrcd   *XRCD
	num    uint32
	numErr error
	tag    string
	deps   []*lifecycle
	recv   recvScratch
}

func (s *SRQ) ctxOf() *Context {
	if s == nil {
		return nil
	}
	return s.c
}
func (q *CQ) ctxOf() *Context {
	if q == nil {
		return nil
	}
	return q.c
}
func (x *XRCD) ctxOf() *Context {
	if x == nil {
		return nil
	}
	return x.c
}

// CreateSRQ creates a basic shared receive queue.
func (p *PD) CreateSRQ(init SRQInit) (*SRQ, error) {
	if p == nil || p.pd == nil || !p.l.ref() {
		return nil, closedErr("ibv_create_srq", p.addr())
	}
	var a C.struct_ibv_srq_init_attr
	a.attr.max_wr = C.uint32_t(init.MaxWR)
	a.attr.max_sge = C.uint32_t(init.MaxSGE)
	a.attr.srq_limit = C.uint32_t(init.Limit)
	srq, err := C.ibv_create_srq(p.pd, &a)
	if srq == nil {
		p.l.unref()
		return nil, &OpError{Op: "ibv_create_srq", Addr: p.tag, Err: errnoOr(err, syscall.EINVAL)}
	}
	s := &SRQ{c: p.c, srq: srq, tag: fmt.Sprintf("%s srq %p", p.c.name, srq), deps: []*lifecycle{&p.l}}
	return s.finish("ibv_create_srq", uint32(a.attr.max_wr), uint32(a.attr.max_sge))
}

// CreateXRCSRQ creates an XRC SRQ in the domain: XRC senders name it by
// number (Num) to deliver into it through any target QP of the domain; its
// completions go to cq.
func (p *PD) CreateXRCSRQ(xrcd *XRCD, cq *CQ, init SRQInit) (*SRQ, error) {
	if p == nil || p.pd == nil {
		return nil, closedErr("ibv_create_srq_ex", p.addr())
	}
	if xrcd == nil || cq == nil {
		return nil, &OpError{Op: "ibv_create_srq_ex", Addr: p.tag, Err: &explained{syscall.EINVAL, "an XRC SRQ needs an XRC domain and a CQ"}}
	}
	if !sameDevice(p.c, xrcd.c, cq.c) {
		return nil, &OpError{Op: "ibv_create_srq_ex", Addr: p.tag, Err: &explained{syscall.EINVAL, "XRC domain and CQ must belong to the PD's device"}}
	}
	// A never-opened domain or CQ has no C handle: the provider reads
	// the handles through them.
	if xrcd.x == nil || cq.cq == nil {
		return nil, closedErr("ibv_create_srq_ex", p.tag+" (XRC domain or CQ never opened)")
	}
	s := &SRQ{c: p.c, xrcd: xrcd}
	for _, l := range []*lifecycle{&p.l, &xrcd.l, &cq.l} {
		if !l.ref() {
			s.release()
			return nil, closedErr("ibv_create_srq_ex", p.tag+" (PD, XRC domain or CQ is closed)")
		}
		s.deps = append(s.deps, l)
	}
	var a C.struct_ibv_srq_init_attr_ex
	a.attr.max_wr = C.uint32_t(init.MaxWR)
	a.attr.max_sge = C.uint32_t(init.MaxSGE)
	a.attr.srq_limit = C.uint32_t(init.Limit)
	a.comp_mask = C.IBV_SRQ_INIT_ATTR_TYPE | C.IBV_SRQ_INIT_ATTR_PD | C.IBV_SRQ_INIT_ATTR_XRCD | C.IBV_SRQ_INIT_ATTR_CQ
	a.srq_type = C.IBV_SRQT_XRC
	a.pd = p.pd
	a.xrcd = xrcd.x
	a.cq = cq.cq
	srq, err := C.goxrc_create_srq_ex(p.c.ctx, &a)
	if srq == nil {
		s.release()
		e := errnoOr(err, syscall.EINVAL)
		return nil, &OpError{Op: "ibv_create_srq_ex", Addr: xrcd.tag, Err: e}
	}
	s.srq = srq
	s.tag = fmt.Sprintf("%s xrc srq %p", p.c.name, srq)
	return s.finish("ibv_create_srq_ex", uint32(a.attr.max_wr), uint32(a.attr.max_sge))
}

func (s *SRQ) finish(op string, maxWR, maxSGE uint32) (*SRQ, error) {
	if !s.recv.alloc(chainSize(maxWR), chainSize(maxWR)*max(1, int(maxSGE))) {
		C.ibv_destroy_srq(s.srq)
		s.release()
		return nil, &OpError{Op: op, Addr: s.tag, Err: syscall.ENOMEM}
	}
	var num C.uint32_t
	if rc, err := C.goxrc_get_srq_num(s.srq, &num); rc != 0 {
		s.numErr = &OpError{Op: "ibv_get_srq_num", Addr: s.tag, Err: rcErr(rc, err)}
	} else {
		s.num = uint32(num)
		s.tag = fmt.Sprintf("%s srq %#x", s.c.name, s.num)
	}
	s.c.reg.mu.Lock()
	s.c.reg.srqs[s.srq] = s
	s.c.reg.mu.Unlock()
	live.srqs.Created(s)
	return s, nil
}

func (s *SRQ) release() {
	for _, d := range s.deps {
		d.unref()
	}
	s.deps = nil
}

func (s *SRQ) addr() string {
	if s == nil {
		return ""
	}
	return s.tag
}

// Num returns the SRQ number senders put in XRC work requests. Devices
// without XRC may not number basic SRQs (ErrNotSupported).
func (s *SRQ) Num() (uint32, error) {
	if s == nil || s.srq == nil || !s.l.use() {
		return 0, closedErr("ibv_get_srq_num", s.addr())
	}
	defer s.l.done()
	return s.num, s.numErr
}

// Arm sets the SRQ limit: once fewer than limit receives remain posted, the
// device raises one EventSRQLimitReached and disarms. limit must not exceed
// the number currently posted on some devices (soft-RoCE).
func (s *SRQ) Arm(limit uint32) error {
	if s == nil || s.srq == nil || !s.l.use() {
		return closedErr("ibv_modify_srq", s.addr())
	}
	defer s.l.done()
	var a C.struct_ibv_srq_attr
	a.srq_limit = C.uint32_t(limit)
	if rc, err := C.ibv_modify_srq(s.srq, &a, C.IBV_SRQ_LIMIT); rc != 0 {
		return &OpError{Op: "ibv_modify_srq", Addr: s.tag, Err: rcErr(rc, err)}
	}
	return nil
}

// PostRecv posts a chain of receives with one C call and no allocation.
func (s *SRQ) PostRecv(wrs []RecvWR) error {
	if s == nil || s.srq == nil || !s.l.use() {
		return closedErr("ibv_post_srq_recv", s.addr())
	}
	defer s.l.done()
	if len(wrs) == 0 {
		return nil
	}
	r := &s.recv
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := r.fill(wrs); err != nil {
		return &OpError{Op: "ibv_post_srq_recv", Addr: s.tag, Err: err}
	}
	if rc := C.goxrc_post_srq_recv(cAddr(unsafe.Pointer(s.srq)), cAddr(unsafe.Pointer(&r.wrs[0])), r.bad); rc != 0 {
		return &OpError{Op: "ibv_post_srq_recv", Addr: s.tag, Err: &PostError{Index: int(*r.bad), Posted: int(*r.bad), Err: rcErr(rc, nil)}}
	}
	return nil
}

// Close destroys the SRQ; it fails with EBUSY while QPs use it. Close is
// idempotent.
func (s *SRQ) Close() error {
	if s == nil || s.srq == nil {
		return nil
	}
	already, err := s.l.beginClose("ibv_destroy_srq", s.tag, "QPs using it")
	if already || err != nil {
		return err
	}
	s.recv.mu.Lock()
	defer s.recv.mu.Unlock()
	if rc, cerr := C.ibv_destroy_srq(s.srq); rc != 0 {
		s.l.endClose(false)
		return &OpError{Op: "ibv_destroy_srq", Addr: s.tag, Err: rcErr(rc, cerr)}
	}
	s.c.reg.mu.Lock()
	if s.c.reg.srqs[s.srq] == s { // else a new SRQ got the freed address
		delete(s.c.reg.srqs, s.srq)
	}
	s.c.reg.mu.Unlock()
	s.recv.free()
	s.release()
	s.l.endClose(true)
	live.srqs.Destroyed(s)
	return nil
}

func qpAttrToC(a *QPAttr, c *C.struct_ibv_qp_attr) {
	*c = C.struct_ibv_qp_attr{}
	c.qp_state = C.enum_ibv_qp_state(a.State)
	c.cur_qp_state = C.enum_ibv_qp_state(a.CurState)
	c.path_mtu = C.enum_ibv_mtu(a.PathMTU)
	c.path_mig_state = C.enum_ibv_mig_state(a.PathMigState)
	c.qkey = C.uint32_t(a.QKey)
	c.rq_psn = C.uint32_t(a.RQPSN)
	c.sq_psn = C.uint32_t(a.SQPSN)
	c.dest_qp_num = C.uint32_t(a.DestQPNum)
	c.qp_access_flags = C.uint(a.AccessFlags)
	c.cap.max_send_wr = C.uint32_t(a.Cap.MaxSendWR)
	c.cap.max_recv_wr = C.uint32_t(a.Cap.MaxRecvWR)
	c.cap.max_send_sge = C.uint32_t(a.Cap.MaxSendSGE)
	c.cap.max_recv_sge = C.uint32_t(a.Cap.MaxRecvSGE)
	c.cap.max_inline_data = C.uint32_t(a.Cap.MaxInlineData)
	ahAttrToC(&a.AH, &c.ah_attr)
	ahAttrToC(&a.AltAH, &c.alt_ah_attr)
	c.pkey_index = C.uint16_t(a.PKeyIndex)
	c.alt_pkey_index = C.uint16_t(a.AltPKeyIndex)
	if a.EnSQDAsyncNotify {
		c.en_sqd_async_notify = 1
	}
	c.max_rd_atomic = C.uint8_t(a.MaxQPRdAtomic)
	c.max_dest_rd_atomic = C.uint8_t(a.MaxDestRdAtomic)
	c.min_rnr_timer = C.uint8_t(a.MinRNRTimer)
	c.port_num = C.uint8_t(a.PortNum)
	c.timeout = C.uint8_t(a.Timeout)
	c.retry_cnt = C.uint8_t(a.RetryCnt)
	c.rnr_retry = C.uint8_t(a.RNRRetry)
	c.alt_port_num = C.uint8_t(a.AltPortNum)
	c.alt_timeout = C.uint8_t(a.AltTimeout)
}

func qpAttrFromC(c *C.struct_ibv_qp_attr) QPAttr {
	return QPAttr{
		State:        QPState(c.qp_state),
		CurState:     QPState(c.cur_qp_state),
		PathMTU:      MTU(c.path_mtu),
		PathMigState: uint8(c.path_mig_state),
		QKey:         uint32(c.qkey),
		RQPSN:        uint32(c.rq_psn),
		SQPSN:        uint32(c.sq_psn),
		DestQPNum:    uint32(c.dest_qp_num),
		AccessFlags:  Access(c.qp_access_flags),
		Cap: QPCap{
			MaxSendWR:     uint32(c.cap.max_send_wr),
			MaxRecvWR:     uint32(c.cap.max_recv_wr),
			MaxSendSGE:    uint32(c.cap.max_send_sge),
			MaxRecvSGE:    uint32(c.cap.max_recv_sge),
			MaxInlineData: uint32(c.cap.max_inline_data),
		},
		AH:               ahAttrFromC(&c.ah_attr),
		AltAH:            ahAttrFromC(&c.alt_ah_attr),
		PKeyIndex:        uint16(c.pkey_index),
		AltPKeyIndex:     uint16(c.alt_pkey_index),
		EnSQDAsyncNotify: c.en_sqd_async_notify != 0,
		SQDraining:       c.sq_draining != 0,
		MaxQPRdAtomic:    uint8(c.max_rd_atomic),
		MaxDestRdAtomic:  uint8(c.max_dest_rd_atomic),
		MinRNRTimer:      uint8(c.min_rnr_timer),
		PortNum:          uint8(c.port_num),
		Timeout:          uint8(c.timeout),
		RetryCnt:         uint8(c.retry_cnt),
		RNRRetry:         uint8(c.rnr_retry),
		AltPortNum:       uint8(c.alt_port_num),
		AltTimeout:       uint8(c.alt_timeout),
	}
}
