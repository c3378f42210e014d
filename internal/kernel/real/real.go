//go:build linux && cgo

package real

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/internal/kernel/kcm"
	"github.com/goxrc/goxrc/internal/turn"
	"github.com/goxrc/goxrc/rdmacm"
	"github.com/goxrc/goxrc/verbs"
)

// Options size the data path.
type Options struct {
	SendBuffer int // bytes of registered send memory per INI (default 8 MiB)
	SendWR     int // send queue depth per INI (default 256)
	RecvSlots  int // receives posted on each SRQ (default 32)
	MinRNR     uint8
}

func (o *Options) fill() {
	if o.SendBuffer <= 0 {
		o.SendBuffer = 8 << 20
	}
	if o.SendWR <= 0 {
		o.SendWR = 256
	}
	if o.RecvSlots <= 0 {
		o.RecvSlots = 32
	}
	// Posted in one chain when the SRQ is made: verbs takes up to 1024.
	o.RecvSlots = min(o.RecvSlots, 1024)
	if o.MinRNR == 0 {
		o.MinRNR = 12 // 0.64 ms instead of rdma_init_qp_attr's 0 (655 ms)
	}
}

// ErrNoXRC is matched by CheckXRC's error on a device without XRC.
var ErrNoXRC = errors.New("device has no XRC")

type xrcdObj struct {
	x    *verbs.XRCD
	uses int
}

type srqObj struct {
	s    *verbs.SRQ
	cq   *verbs.CQ
	ch   *verbs.CompChannel
	mr   *verbs.MR
	via  *xrcdObj
	num  uint32
	slot int
	// One poller at a time (its scratch and the repost that follows each
	// copy are its own); a second waits for its turn until its context
	// ends.
	poll turn.Turn
	mu   sync.Mutex // held from the copy to the repost, so close waits
	dead bool       // under mu: close freed the receive memory
	// The poller's scratch (its turn's), reused so that polling does not
	// allocate.
	wcs    []verbs.WorkCompletion
	repost []verbs.RecvWR
	sges   []verbs.SGE
}

type qpObj struct {
	q      *verbs.QP
	typ    verbs.QPType
	via    *xrcdObj // TGT only
	opened bool     // a TGT handle from ibv_open_qp
	// INI only: the send CQ and a byte ring of registered send memory,
	// released in completion order.
	cq   *verbs.CQ
	ch   *verbs.CompChannel
	mr   *verbs.MR
	mu   sync.Mutex
	dead bool     // under mu: close freed the send memory
	ring sendRing // the send memory (under mu)
	rts  bool     // it reached RTS (under mu)
	// PostSend's scratch (under mu), and PollSend's (its poll turn's):
	// reused so that the data path does not allocate.
	vw    []verbs.SendWR
	sges  []verbs.SGE
	spans []span
	poll  turn.Turn
	wcs   []verbs.WorkCompletion
}

// Process is one process's kernel on one device.
type Process struct {
	dev     string
	local   netip.Addr
	opts    Options
	ctx     *verbs.Context
	pd      *verbs.PD
	xrc     bool
	*kcm.CM // the CM half: Listen, Connect, Accept, Reject, Establish, Disconnect, DestroyID, Event

	mu     sync.Mutex
	next   uint64
	closed bool
	objs   map[uint64]any // *xrcdObj, *srqObj, *qpObj

	// The device's async events, read and, but for DEVICE_FATAL (which
	// closes fatal), dropped: the engine learns of other failures from
	// completions and the CM, and the kernel keeps every event of an open
	// device until it is read (ib_uverbs_async_handler queues them without
	// a bound), so a long-lived process that never read them would grow
	// kernel memory with each QP's LAST_WQE_REACHED or error event.
	// asyncDone is closed when the channel has ended.
	asyncRead atomic.Uint64
	asyncDone chan struct{}
	fatal     chan struct{}
}

var _ kernel.Kernel = (*Process)(nil)

// Open opens device dev, whose address is local, for one process.
func Open(dev string, local netip.Addr, opts Options) (_ *Process, err error) {
	opts.fill()
	p := &Process{dev: dev, local: local.Unmap(), opts: opts, objs: map[uint64]any{}, fatal: make(chan struct{})}
	defer func() {
		if err != nil {
			p.Close()
		}
	}()
	if p.ctx, err = verbs.OpenDevice(dev); err != nil {
		return nil, err
	}
	events := p.ctx.AsyncEvents()
	if events == nil {
		return nil, p.ctx.AsyncErr()
	}
	p.asyncDone = make(chan struct{})
	go func() {
		defer close(p.asyncDone)
		fatal := false // this goroutine alone closes p.fatal
		for ev := range events {
			p.asyncRead.Add(1)
			if ev.Type == verbs.EventDeviceFatal && !fatal {
				fatal = true
				close(p.fatal)
			}
		}
	}()
	attr, err := p.ctx.QueryDevice()
	if err != nil {
		return nil, err
	}
	p.xrc = attr.XRC()
	if p.pd, err = p.ctx.AllocPD(); err != nil {
		return nil, err
	}
	if p.CM, err = kcm.New(p.local); err != nil {
		return nil, err
	}
	return p, nil
}

// CheckXRC tells whether XRC works on the device: nil if it claims XRC and a
// private domain opens; an error matching ErrNoXRC if it claims none and
// ibv_open_xrcd fails with EOPNOTSUPP, naming both; any other combination is
// an inconsistency, reported as a different error.
func (p *Process) CheckXRC() error {
	x, err := p.ctx.OpenXRCD("", verbs.XRCDCreate)
	if err == nil {
		x.Close()
	}
	switch {
	case p.xrc && err == nil:
		return nil
	case !p.xrc && errors.Is(err, verbs.ErrNotSupported):
		why := "operation not supported"
		var errno syscall.Errno
		if errors.As(err, &errno) {
			why = errno.Error()
		}
		return fmt.Errorf("device %s has no XRC (IBV_DEVICE_XRC clear; ibv_open_xrcd: %s)%w", p.dev, why, noXRC{})
	case p.xrc:
		return fmt.Errorf("device %s claims XRC (IBV_DEVICE_XRC set) but ibv_open_xrcd fails: %w", p.dev, err)
	case err == nil:
		return fmt.Errorf("device %s has IBV_DEVICE_XRC clear but ibv_open_xrcd succeeds", p.dev)
	default:
		return fmt.Errorf("device %s has no XRC (IBV_DEVICE_XRC clear) and ibv_open_xrcd fails with an unexpected error: %w", p.dev, err)
	}
}

// noXRC makes CheckXRC's message end where it should and match ErrNoXRC.
type noXRC struct{}

func (noXRC) Error() string        { return "" }
func (noXRC) Is(target error) bool { return target == ErrNoXRC }

// DeviceFatal is closed once the device reports IBV_EVENT_DEVICE_FATAL.
func (p *Process) DeviceFatal() <-chan struct{} { return p.fatal }

func (p *Process) LocalAddr() netip.Addr { return p.local }
func (p *Process) XRC() bool             { return p.xrc }

func closedErr(op string) error { return &verbs.OpError{Op: op, Err: verbs.ErrClosed} }
func errno(op string, e syscall.Errno) error {
	return &verbs.OpError{Op: op, Err: e}
}

func (p *Process) add(o any) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, closedErr("add")
	}
	p.next++
	p.objs[p.next] = o
	return p.next, nil
}

func get[T any](p *Process, op string, h uint64) (T, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var zero T
	if p.closed {
		return zero, closedErr(op)
	}
	o, ok := p.objs[h].(T)
	if !ok {
		return zero, errno(op, syscall.EBADF)
	}
	return o, nil
}

func (p *Process) OpenXRCD(path string, flags kernel.XRCDFlags) (kernel.XRCD, error) {
	var vf verbs.XRCDFlags
	if flags&kernel.XRCDCreate != 0 {
		vf |= verbs.XRCDCreate
	}
	if flags&kernel.XRCDExcl != 0 {
		vf |= verbs.XRCDExclusive
	}
	x, err := p.ctx.OpenXRCD(path, vf)
	if err != nil {
		return 0, err
	}
	h, err := p.add(&xrcdObj{x: x})
	if err != nil {
		x.Close()
	}
	return kernel.XRCD(h), err
}

func (p *Process) CloseXRCD(d kernel.XRCD) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	x, ok := p.objs[uint64(d)].(*xrcdObj)
	switch {
	case p.closed:
		return closedErr("ibv_close_xrcd")
	case !ok:
		return errno("ibv_close_xrcd", syscall.EBADF)
	case x.uses > 0:
		return errno("ibv_close_xrcd", syscall.EBUSY)
	}
	if err := x.x.Close(); err != nil {
		return err // the handle stays, to be closed again
	}
	delete(p.objs, uint64(d))
	return nil
}

func (p *Process) CreateSRQ(d kernel.XRCD, slot int) (_ kernel.SRQ, _ uint32, err error) {
	if slot <= 0 {
		return 0, 0, errno("ibv_create_srq_ex", syscall.EINVAL)
	}
	x, err := p.useXRCD(d, "ibv_create_srq_ex")
	if err != nil {
		return 0, 0, err
	}
	s := &srqObj{via: x, slot: slot, poll: turn.New()}
	defer func() {
		if err != nil {
			s.close()
			p.unuseXRCD(x)
		}
	}()
	if s.ch, err = p.ctx.NewCompChannel(); err != nil {
		return 0, 0, err
	}
	if s.cq, err = p.ctx.CreateCQ(p.opts.RecvSlots*2, s.ch, 0); err != nil {
		return 0, 0, err
	}
	if s.s, err = p.pd.CreateXRCSRQ(x.x, s.cq, verbs.SRQInit{MaxWR: uint32(p.opts.RecvSlots), MaxSGE: 1}); err != nil {
		return 0, 0, err
	}
	if s.num, err = s.s.Num(); err != nil {
		return 0, 0, err
	}
	if s.mr, err = p.pd.RegMR(p.opts.RecvSlots*slot, verbs.AccessLocalWrite); err != nil {
		return 0, 0, err
	}
	wrs := make([]verbs.RecvWR, p.opts.RecvSlots)
	for i := range wrs {
		wrs[i] = verbs.RecvWR{ID: uint64(i), SGL: []verbs.SGE{s.mr.SGE(i*s.slot, s.slot)}}
	}
	if err = s.s.PostRecv(wrs); err != nil {
		return 0, 0, err
	}
	h, err := p.add(s)
	if err != nil {
		return 0, 0, err
	}
	return kernel.SRQ(h), s.num, nil
}

// close destroys the SRQ and its CQ first (which wakes a poller), then,
// once no poller copies out of it, the receive memory.
func (s *srqObj) isDead() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.dead
}

func (s *srqObj) close() {
	if s.s != nil {
		s.s.Close()
	}
	if s.cq != nil {
		s.cq.Close()
	}
	s.mu.Lock()
	s.dead = true
	s.mu.Unlock()
	if s.mr != nil {
		s.mr.Close()
	}
	if s.ch != nil {
		s.ch.Close()
	}
}

func (p *Process) DestroySRQ(h kernel.SRQ) error {
	p.mu.Lock()
	s, ok := p.objs[uint64(h)].(*srqObj)
	if p.closed || !ok {
		p.mu.Unlock()
		if p.closed {
			return closedErr("ibv_destroy_srq")
		}
		return errno("ibv_destroy_srq", syscall.EBADF)
	}
	p.mu.Unlock()
	if s.s != nil {
		if err := s.s.Close(); err != nil {
			return err // the SRQ stays, and its handle: the caller may try again
		}
	}
	p.mu.Lock()
	if p.objs[uint64(h)] == s {
		delete(p.objs, uint64(h))
		s.via.uses--
	}
	p.mu.Unlock()
	s.close()
	return nil
}

func (p *Process) CreateINI() (_ kernel.QP, _ uint32, err error) {
	q := &qpObj{typ: verbs.QPTypeXRCSend, poll: turn.New()}
	defer func() {
		if err != nil {
			q.close()
		}
	}()
	if q.ch, err = p.ctx.NewCompChannel(); err != nil {
		return 0, 0, err
	}
	// Every send is signaled, and a driver may round the send queue up
	// (mlx5: to a power of two, past a CQ of SendWR entries): room for
	// twice SendWR keeps the CQ from overrunning.
	if q.cq, err = p.ctx.CreateCQ(2*p.opts.SendWR, q.ch, 0); err != nil {
		return 0, 0, err
	}
	if q.mr, err = p.pd.RegMR(p.opts.SendBuffer, verbs.AccessLocalWrite); err != nil {
		return 0, 0, err
	}
	q.ring.size = q.mr.Len()
	if q.q, err = p.pd.CreateQP(verbs.QPInit{Type: verbs.QPTypeXRCSend, SendCQ: q.cq,
		Cap: verbs.QPCap{MaxSendWR: uint32(p.opts.SendWR), MaxSendSGE: 1}}); err != nil {
		return 0, 0, err
	}
	h, err := p.add(q)
	if err != nil {
		return 0, 0, err
	}
	return kernel.QP(h), q.q.Num(), nil
}

// close destroys the QP and its CQ first (which wakes a poller), then,
// once no post copies into it, the send memory.
func (q *qpObj) close() {
	if q.q != nil {
		q.q.Close()
	}
	if q.cq != nil {
		q.cq.Close()
	}
	q.mu.Lock()
	q.dead = true
	q.mu.Unlock()
	if q.mr != nil {
		q.mr.Close()
	}
	if q.ch != nil {
		q.ch.Close()
	}
}

func (p *Process) tgt(d kernel.XRCD, op string, opened bool, mk func(*verbs.XRCD) (*verbs.QP, error)) (kernel.QP, uint32, error) {
	x, err := p.useXRCD(d, op)
	if err != nil {
		return 0, 0, err
	}
	vq, err := mk(x.x)
	if err != nil {
		p.unuseXRCD(x)
		return 0, 0, err
	}
	h, err := p.add(&qpObj{q: vq, typ: verbs.QPTypeXRCRecv, via: x, opened: opened})
	if err != nil {
		vq.Close()
		p.unuseXRCD(x)
		return 0, 0, err
	}
	return kernel.QP(h), vq.Num(), nil
}

// useXRCD looks d up and counts a use of it in one step, so that CloseXRCD
// cannot close it while an SRQ or TGT is being made in it.
func (p *Process) useXRCD(d kernel.XRCD, op string) (*xrcdObj, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	x, ok := p.objs[uint64(d)].(*xrcdObj)
	switch {
	case p.closed:
		return nil, closedErr(op)
	case !ok:
		return nil, errno(op, syscall.EBADF)
	}
	x.uses++
	return x, nil
}

func (p *Process) unuseXRCD(x *xrcdObj) {
	p.mu.Lock()
	x.uses--
	p.mu.Unlock()
}

func (p *Process) CreateTGT(d kernel.XRCD) (kernel.QP, uint32, error) {
	return p.tgt(d, "ibv_create_qp_ex", false, p.ctx.CreateXRCRecvQP)
}

func (p *Process) OpenTGT(d kernel.XRCD, qpn uint32) (kernel.QP, error) {
	h, _, err := p.tgt(d, "ibv_open_qp", true, func(x *verbs.XRCD) (*verbs.QP, error) { return p.ctx.OpenQP(x, qpn) })
	return h, err
}

func (p *Process) DestroyQP(h kernel.QP) error {
	p.mu.Lock()
	q, ok := p.objs[uint64(h)].(*qpObj)
	if p.closed || !ok {
		p.mu.Unlock()
		if p.closed {
			return closedErr("ibv_destroy_qp")
		}
		return errno("ibv_destroy_qp", syscall.EBADF)
	}
	p.mu.Unlock()
	if q.q != nil {
		// A TGT handle whose destroy fails stays, and the XRCD's use
		// with it: dropped, the XRCD's close would fail for ever and
		// the remote INI keep a live TGT.
		if err := q.q.Close(); err != nil {
			return err
		}
	}
	p.mu.Lock()
	if p.objs[uint64(h)] == q {
		delete(p.objs, uint64(h))
		if q.via != nil {
			q.via.uses--
		}
	}
	p.mu.Unlock()
	q.close()
	return nil
}

func (p *Process) QueryQP(h kernel.QP) (kernel.QPInfo, error) {
	q, err := get[*qpObj](p, "ibv_query_qp", uint64(h))
	if err != nil {
		return kernel.QPInfo{}, err
	}
	a, _, err := q.q.Query(verbs.QPAttrState | verbs.QPAttrDestQPN | verbs.QPAttrAV)
	if err != nil {
		return kernel.QPInfo{}, err
	}
	info := kernel.QPInfo{Num: q.q.Num(), Type: q.typ, State: a.State}
	if a.DestQPNum != 0 {
		info.DestQPN = a.DestQPNum
		if ip, ok := netip.AddrFromSlice(a.AH.GRH.DGID[:]); ok && !a.AH.GRH.DGID.IsZero() {
			info.Remote = ip.Unmap()
		}
	}
	return info, nil
}

// TransitionQP moves q step by step to `to` with rdma_init_qp_attr's
// attributes from via, the mask trimmed to the QP type's transition and
// min_rnr_timer set where the type has it.
func (p *Process) TransitionQP(h kernel.QP, to verbs.QPState, via kernel.ID) error {
	q, err := get[*qpObj](p, "ibv_modify_qp", uint64(h))
	if err != nil {
		return err
	}
	if to == verbs.QPStateReset && q.opened {
		// mlx5 writes a doorbell record that an opened handle lacks.
		return errno("ibv_modify_qp", syscall.EINVAL)
	}
	switch to {
	case verbs.QPStateErr, verbs.QPStateReset:
		if err := q.q.Modify(&verbs.QPAttr{State: to}, verbs.QPAttrState); err != nil {
			return err
		}
		if to == verbs.QPStateReset {
			q.mu.Lock()
			q.rts = false // posts are refused until it is RTS again, as the model's
			// Nothing in flight completes: the reset drops the sends, and
			// mlx5_modify_qp their completions from the CQ (mlx5_cq_clean),
			// so none would give its send memory back.
			q.ring = sendRing{size: q.ring.size, out: q.ring.out[:0]}
			q.mu.Unlock()
		}
		return nil
	case verbs.QPStateInit, verbs.QPStateRTR, verbs.QPStateRTS:
	default:
		return errno("ibv_modify_qp", syscall.EINVAL)
	}
	// Only moves up ask the state (QUERY_QP, which a failed device
	// refuses while it still takes moves to ERR and RESET).
	a, _, err := q.q.Query(verbs.QPAttrState)
	if err != nil {
		return err
	}
	cur := a.State
	if cur == verbs.QPStateErr || cur > to {
		return errno("ibv_modify_qp", syscall.EINVAL)
	}
	if cur == to {
		return nil
	}
	if via == 0 {
		return errno("rdma_init_qp_attr", syscall.EINVAL)
	}
	id, err := p.CM.RawID(via)
	if err != nil {
		return err
	}
	for cur < to {
		next := cur + 1
		attr, mask, err := id.InitQPAttr(next)
		if err != nil {
			return err
		}
		mask &= verbs.AllowedMask(q.typ, cur, next)
		if allowed := verbs.AllowedMask(q.typ, cur, next); allowed&verbs.QPAttrMinRNRTimer != 0 {
			attr.MinRNRTimer = p.opts.MinRNR
			mask |= verbs.QPAttrMinRNRTimer
		}
		if mask&verbs.QPAttrMaxDestRdAtomic != 0 && attr.MaxDestRdAtomic > 1 {
			// A TGT moves before rdma_accept, when the CM still holds
			// the REQ's initiator depth: more than the HCA takes fails
			// the move. The protocol sends; kcm's accept offers 1 too.
			attr.MaxDestRdAtomic = 1
		}
		if next == verbs.QPStateRTS && q.typ == verbs.QPTypeXRCSend {
			// 6, not 7: soft-RoCE retries for ever at 7, and a peer
			// node that vanished would never fail the INI there
			// (rdmacm.RetryCountFinite; kcm's links ask for 6 too).
			attr.RetryCnt, attr.RNRRetry = rdmacm.RetryCountFinite, 7
			if attr.Timeout == 0 {
				attr.Timeout = 14
			}
			mask |= verbs.QPAttrRetryCnt | verbs.QPAttrRNRRetry | verbs.QPAttrTimeout
		}
		attr.State = next
		if err := q.q.Modify(&attr, mask|verbs.QPAttrState); err != nil {
			return err
		}
		cur = next
	}
	if cur == verbs.QPStateRTS {
		q.mu.Lock()
		q.rts = true
		q.mu.Unlock()
	}
	return nil
}

// PostSend copies each payload into the INI's registered send memory and
// posts the chain: sends with immediate naming the remote SRQ.
func (p *Process) PostSend(h kernel.QP, wrs []kernel.SendWR) error {
	const op = "ibv_post_send"
	q, err := get[*qpObj](p, op, uint64(h))
	if err != nil {
		return err
	}
	if q.typ != verbs.QPTypeXRCSend {
		return errno(op, syscall.EINVAL)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.dead {
		return errno(op, syscall.EBADF)
	}
	if !q.rts {
		// As the seam says (EINVAL before RTS); mlx5 would answer ENOMEM,
		// which means "the queue is full" to the engine.
		return errno(op, syscall.EINVAL)
	}
	if len(wrs) == 0 {
		return nil // nothing to post; ENOMEM would say the queue is full
	}
	buf := q.mr.Bytes()
	vw := resize(q.vw, len(wrs))
	sges := resize(q.sges, len(wrs))
	spans := q.spans[:0]
	head, used := q.ring.head, q.ring.used
	fit := len(wrs) // the requests before the first that does not fit go (the seam's ENOMEM)
	for i, wr := range wrs {
		n := len(wr.Payload)
		s, ok := q.ring.place(head, used, wr.WRID, n)
		if !ok {
			fit = i
			break
		}
		copy(buf[s.off:], wr.Payload)
		head, used = q.ring.next(s, used)
		spans = append(spans, s)
		vw[i] = verbs.SendWR{ID: wr.WRID, Opcode: verbs.WRSendWithImm, Flags: verbs.SendSignaled,
			Imm: wr.Imm, RemoteSRQNum: wr.RemoteSRQN}
		if n > 0 {
			sges[i] = q.mr.SGE(s.off, n)
			vw[i].SGL = sges[i : i+1]
		}
	}
	q.vw, q.sges, q.spans = vw, sges, spans
	if fit == 0 {
		return errno(op, syscall.ENOMEM)
	}
	if err := q.q.PostSend(vw[:fit]); err != nil {
		// Work requests before the failed one were posted.
		var pe *verbs.PostError
		if errors.As(err, &pe) {
			if k := pe.Posted; k > 0 && k <= len(spans) {
				q.ring.commit(spans[:k])
			}
		}
		return err
	}
	q.ring.commit(spans)
	if fit < len(wrs) {
		return errno(op, syscall.ENOMEM)
	}
	return nil
}

// release frees the send memory of completions, which come in posting order.
func (q *qpObj) release(wrid uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.ring.release(wrid)
}

// resize returns s with length n, reusing its array when it is large enough.
func resize[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

func (p *Process) PollSend(ctx context.Context, h kernel.QP, out []kernel.SendCompletion) (int, error) {
	q, err := get[*qpObj](p, "ibv_poll_cq", uint64(h))
	if err != nil {
		return 0, err
	}
	if q.cq == nil || len(out) == 0 {
		return 0, errno("ibv_poll_cq", syscall.EINVAL)
	}
	if err := q.poll.Take(ctx); err != nil {
		return 0, err
	}
	defer q.poll.Give()
	q.wcs = resize(q.wcs, min(len(out), 256))
	n, err := q.cq.Wait(ctx, q.wcs)
	for i, wc := range q.wcs[:n] {
		q.release(wc.WRID)
		out[i] = kernel.SendCompletion{WRID: wc.WRID, Status: wc.Status, QPNum: q.q.Num()}
	}
	return n, err
}

func (p *Process) PollRecv(ctx context.Context, h kernel.SRQ, out []kernel.RecvCompletion) (int, error) {
	s, err := get[*srqObj](p, "ibv_poll_cq", uint64(h))
	if err != nil {
		return 0, err
	}
	if len(out) == 0 {
		return 0, errno("ibv_poll_cq", syscall.EINVAL)
	}
	if err := s.poll.Take(ctx); err != nil {
		return 0, err
	}
	defer s.poll.Give()
	if s.isDead() {
		return 0, errno("ibv_poll_cq", syscall.EBADF)
	}
	s.wcs = resize(s.wcs, min(len(out), 256))
	wcs := s.wcs
	n, err := s.cq.Wait(ctx, wcs)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead {
		return 0, errno("ibv_poll_cq", syscall.EBADF)
	}
	buf := s.mr.Bytes()
	s.sges = resize(s.sges, n)
	repost := s.repost[:0]
	for i, wc := range wcs[:n] {
		off := int(wc.WRID) * s.slot
		rc := kernel.RecvCompletion{TGTQPN: wc.QPNum, Status: wc.Status}
		if wc.Flags&verbs.WCWithImm != 0 {
			rc.Imm = wc.Imm
		}
		if wc.Status == verbs.WCSuccess && (int(wc.ByteLen) > s.slot || wc.Opcode == verbs.WCRecvRDMAWithImm) {
			// The length is the peer's: a write with immediate data
			// reports its own length and fills no slot. Dropped, as a
			// failed receive is (cm's RC path fails the connection).
			rc.Status = verbs.WCLocLenErr
		}
		if rc.Status == verbs.WCSuccess {
			rc.Payload = kernel.NewPayload(int(wc.ByteLen))
			copy(rc.Payload, buf[off:off+int(wc.ByteLen)])
		}
		out[i] = rc
		// Flushed slots too: an XRC SRQ completes a receive as flushed
		// when the TGT it came through fails mid-message, and lives on
		// (destroying it completes nothing). Not reposted, the slot
		// would be lost, and with it, in time, the SRQ.
		s.sges[i] = s.mr.SGE(off, s.slot)
		repost = append(repost, verbs.RecvWR{ID: wc.WRID, SGL: s.sges[i : i+1]})
	}
	s.repost = repost
	if len(repost) > 0 {
		if err2 := s.s.PostRecv(repost); err2 != nil && err == nil {
			err = err2
		}
	}
	return n, err
}

// Handles counts the kernel objects (domains, SRQs, QPs and TGT handles)
// and CM ids the process holds, as the model's Handles does.
func (p *Process) Handles() int {
	p.mu.Lock()
	n := len(p.objs)
	p.mu.Unlock()
	if p.CM != nil {
		n += p.CM.Len()
	}
	return n
}

// Close releases everything, as process exit does: CM ids, QPs and TGT
// handles, SRQs, domains, the PD and the device.
func (p *Process) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	objs := p.objs
	p.objs = nil
	p.mu.Unlock()
	if p.CM != nil {
		p.CM.Close()
	}
	for _, o := range objs {
		if q, ok := o.(*qpObj); ok {
			q.close()
		}
	}
	for _, o := range objs {
		if s, ok := o.(*srqObj); ok {
			s.close()
		}
	}
	for _, o := range objs {
		if x, ok := o.(*xrcdObj); ok {
			x.x.Close()
		}
	}
	if p.pd != nil {
		p.pd.Close()
	}
	if p.ctx == nil {
		return nil
	}
	err := p.ctx.Close() // ends the async events' channel
	if err == nil && p.asyncDone != nil {
		// (Where Close failed, the context stays open and its
		// events go on being read.)
		<-p.asyncDone
	}
	return err
}

// AsyncEventsRead is how many of the device's async events the process has
// read (and dropped).
func (p *Process) AsyncEventsRead() uint64 { return p.asyncRead.Load() }
