package model

import (
	"bytes"
	"context"
	"net/netip"
	"os"
	"slices"
	"syscall"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/verbs"
)

// Process is one process on a node: a kernel.Kernel. Kill (or Close) is its
// death: every handle and CM id it holds is closed at once.
type Process struct {
	n       *Node
	pid     int
	handles map[uint64]any // *xrcdHandle, *srq, *qpHandle, *cmid
	closed  bool
	done    chan struct{}
	fatal   chan struct{} // closed by Node.FailDevice
	// recvPaused: PollRecv finds nothing (PauseReceives); resumed wakes
	// its pollers. Under the fabric's lock.
	recvPaused bool
	resumed    queue[kernel.RecvCompletion]
}

var _ kernel.Kernel = (*Process)(nil)

// PauseReceives makes the process stop taking messages from its SRQs, as a
// process stopped (SIGSTOP) or stalled would, until ResumeReceives:
// PollRecv finds nothing, the messages stay on the SRQs, and with
// NodeConfig.SRQReceives the next ones wait at their senders' INIs. The
// rest of the process runs on. A PollRecv whose deadline passes while
// messages wait returns EINTR, not its deadline's error (which says the
// SRQ was found empty).
func (p *Process) PauseReceives() {
	p.lock()
	defer p.unlock()
	p.recvPaused = true
}

// ResumeReceives ends PauseReceives.
func (p *Process) ResumeReceives() {
	p.lock()
	defer p.unlock()
	p.recvPaused = false
	p.resumed.close() // wakes every poller, to look again
	p.resumed = newQueue[kernel.RecvCompletion]()
}

// Node is the node the process runs on.
func (p *Process) Node() *Node { return p.n }

// Handles is the number of live handles and CM ids the process holds.
func (p *Process) Handles() int {
	p.n.f.mu.Lock()
	defer p.n.f.mu.Unlock()
	return len(p.handles)
}

// DeviceFatal is closed once the node's device has failed (Node.FailDevice).
func (p *Process) DeviceFatal() <-chan struct{} { return p.fatal }

// deviceErr is what a call that takes a firmware command returns on a
// failed device: mlx5 fails every command but the destroys and the moves
// to ERR or RESET with EIO once the device is in its internal error state
// (mlx5_internal_err_ret_value).
func (p *Process) deviceErr(op string) error {
	if p.n.failed {
		return opErr(op, syscall.EIO)
	}
	return nil
}

func (p *Process) LocalAddr() netip.Addr { return p.n.addr }
func (p *Process) XRC() bool             { return p.n.xrc }

// lookup returns the live object behind handle h, of type T.
func lookup[T any](p *Process, op string, h uint64) (T, error) {
	var zero T
	if p.closed {
		return zero, &verbs.OpError{Op: op, Err: verbs.ErrClosed}
	}
	o, ok := p.handles[h].(T)
	if !ok {
		return zero, opErr(op, syscall.EBADF)
	}
	return o, nil
}

// destroyHandle closes handle h, which must name a T, with destroy.
func destroyHandle[T any](p *Process, op string, h uint64, destroy func(T)) error {
	p.lock()
	defer p.unlock()
	o, err := lookup[T](p, op, h)
	if err != nil {
		return err
	}
	delete(p.handles, h)
	destroy(o)
	return nil
}

func (p *Process) lock()   { p.n.f.mu.Lock() }
func (p *Process) unlock() { p.n.f.retryRNR(); p.n.f.mu.Unlock() }

func (p *Process) add(o any) uint64 {
	h := p.n.f.handle()
	p.handles[h] = o
	return h
}

func (p *Process) OpenXRCD(path string, flags kernel.XRCDFlags) (kernel.XRCD, error) {
	const op = "ibv_open_xrcd"
	p.lock()
	defer p.unlock()
	if p.closed {
		return 0, &verbs.OpError{Op: op, Err: verbs.ErrClosed}
	}
	if !p.n.xrc {
		return 0, opErr(op, syscall.EOPNOTSUPP)
	}
	n := p.n
	if path == "" { // fd = -1: a private domain
		if err := p.deviceErr(op); err != nil {
			return 0, err // ALLOC_XRCD
		}
		d := &xrcd{n: n, refs: 1}
		n.xrcds = append(n.xrcds, d)
		return kernel.XRCD(p.add(&xrcdHandle{d: d})), nil
	}
	// The domain is keyed by inode, like the kernel's xrcd tree. The file
	// stays open while the domain lives, so the inode number cannot be reused
	// by a recreated file: unlink + create gives a second domain. With
	// XRCDCreate a missing file is created, as verbs.Context.OpenXRCD does.
	oflags := os.O_RDONLY
	if flags&kernel.XRCDCreate != 0 {
		oflags |= os.O_CREATE
	}
	file, err := os.OpenFile(path, oflags, 0o600)
	if err != nil {
		return 0, &verbs.OpError{Op: op, Addr: path, Err: err}
	}
	fi, err := file.Stat()
	if err != nil {
		file.Close()
		return 0, &verbs.OpError{Op: op, Addr: path, Err: err}
	}
	var d *xrcd
	for _, x := range n.xrcds {
		if x.fi != nil && os.SameFile(x.fi, fi) {
			d = x
		}
	}
	switch {
	case d == nil && flags&kernel.XRCDCreate == 0:
		file.Close()
		return 0, &verbs.OpError{Op: op, Addr: path, Err: syscall.EAGAIN}
	case d != nil && flags&kernel.XRCDExcl != 0:
		file.Close()
		return 0, &verbs.OpError{Op: op, Addr: path, Err: syscall.EINVAL}
	case d == nil:
		if err := p.deviceErr(op); err != nil {
			file.Close()
			return 0, err // ALLOC_XRCD; opening the inode's domain sends no command
		}
		d = &xrcd{n: n, file: file, fi: fi}
		n.xrcds = append(n.xrcds, d)
	default:
		file.Close()
	}
	d.refs++
	return kernel.XRCD(p.add(&xrcdHandle{d: d})), nil
}

func (p *Process) CloseXRCD(h kernel.XRCD) error {
	p.lock()
	defer p.unlock()
	x, err := lookup[*xrcdHandle](p, "ibv_close_xrcd", uint64(h))
	if err != nil {
		return err
	}
	if x.uses > 0 {
		return opErr("ibv_close_xrcd", syscall.EBUSY)
	}
	delete(p.handles, uint64(h))
	x.d.unref()
	return nil
}

func (p *Process) CreateSRQ(h kernel.XRCD, slot int) (kernel.SRQ, uint32, error) {
	p.lock()
	defer p.unlock()
	x, err := lookup[*xrcdHandle](p, "ibv_create_srq_ex", uint64(h))
	if err == nil {
		err = p.deviceErr("ibv_create_srq_ex")
	}
	if err != nil {
		return 0, 0, err
	}
	if slot <= 0 {
		return 0, 0, opErr("ibv_create_srq_ex", syscall.EINVAL)
	}
	s := &srq{num: p.n.srqns.get(), slot: slot, cap: p.n.srqRecvs, d: x.d, via: x, recv: newQueue[kernel.RecvCompletion]()}
	x.uses++
	x.d.refs++
	p.n.srqs[s.num] = s
	return kernel.SRQ(p.add(s)), s.num, nil
}

func (p *Process) DestroySRQ(h kernel.SRQ) error {
	return destroyHandle(p, "ibv_destroy_srq", uint64(h), p.destroySRQ)
}

func (p *Process) destroySRQ(s *srq) {
	delete(p.n.srqs, s.num)
	p.n.srqns.put(s.num)
	s.recv.close()
	s.via.uses--
	s.d.unref()
}

func (p *Process) CreateINI() (kernel.QP, uint32, error) {
	p.lock()
	defer p.unlock()
	if p.closed {
		return 0, 0, &verbs.OpError{Op: "ibv_create_qp_ex", Err: verbs.ErrClosed}
	}
	if !p.n.xrc {
		return 0, 0, opErr("ibv_create_qp_ex", syscall.EOPNOTSUPP) // rxe: no XRC QP type
	}
	if err := p.deviceErr("ibv_create_qp_ex"); err != nil {
		return 0, 0, err
	}
	sq := newQueue[kernel.SendCompletion]()
	q := &qp{n: p.n, num: p.n.qpns.get(), typ: verbs.QPTypeXRCSend, sendq: &sq}
	p.n.qps[q.num] = q
	return kernel.QP(p.add(&qpHandle{q: q})), q.num, nil
}

func (p *Process) CreateTGT(h kernel.XRCD) (kernel.QP, uint32, error) {
	p.lock()
	defer p.unlock()
	x, err := lookup[*xrcdHandle](p, "ibv_create_qp_ex", uint64(h))
	if err == nil {
		err = p.deviceErr("ibv_create_qp_ex")
	}
	if err != nil {
		return 0, 0, err
	}
	q := &qp{n: p.n, num: p.n.qpns.get(), typ: verbs.QPTypeXRCRecv, d: x.d, handles: 1}
	x.d.refs++
	x.uses++
	p.n.qps[q.num] = q
	return kernel.QP(p.add(&qpHandle{q: q, via: x})), q.num, nil
}

func (p *Process) OpenTGT(h kernel.XRCD, qpn uint32) (kernel.QP, error) {
	p.lock()
	defer p.unlock()
	x, err := lookup[*xrcdHandle](p, "ibv_open_qp", uint64(h))
	if err != nil {
		return 0, err // (ib_open_qp sends no command: it works on a failed device)
	}
	// Found by number in the domain's TGT list: whatever now has the number.
	q := p.n.qps[qpn]
	if q == nil || q.typ != verbs.QPTypeXRCRecv || q.d != x.d {
		return 0, opErr("ibv_open_qp", syscall.EINVAL)
	}
	q.handles++
	x.uses++
	return kernel.QP(p.add(&qpHandle{q: q, via: x, opened: true})), nil
}

func (p *Process) DestroyQP(h kernel.QP) error {
	return destroyHandle(p, "ibv_destroy_qp", uint64(h), p.destroyQP)
}

func (p *Process) destroyQP(qh *qpHandle) {
	q := qh.q
	if q.typ == verbs.QPTypeXRCRecv {
		qh.via.uses--
		q.handles--
		if q.handles > 0 {
			return // the TGT lives on for its other holders
		}
		q.d.unref()
	} else {
		q.sendq.close()
	}
	delete(p.n.qps, q.num)
	p.n.qpns.put(q.num)
	q.state = verbs.QPStateReset
}

func (p *Process) QueryQP(h kernel.QP) (kernel.QPInfo, error) {
	p.lock()
	defer p.unlock()
	qh, err := lookup[*qpHandle](p, "ibv_query_qp", uint64(h))
	if err == nil {
		err = p.deviceErr("ibv_query_qp") // QUERY_QP
	}
	if err != nil {
		return kernel.QPInfo{}, err
	}
	q := qh.q
	return kernel.QPInfo{Num: q.num, Type: q.typ, State: q.state, DestQPN: q.destQPN, Remote: q.remote}, nil
}

func (p *Process) TransitionQP(h kernel.QP, to verbs.QPState, via kernel.ID) error {
	const op = "ibv_modify_qp"
	p.lock()
	defer p.unlock()
	qh, err := lookup[*qpHandle](p, op, uint64(h))
	if err != nil {
		return err
	}
	q := qh.q
	switch to {
	case verbs.QPStateErr:
		if q.state == verbs.QPStateReset {
			return opErr(op, syscall.EINVAL) // ib_modify_qp_is_ok: no RESET->ERR
		}
		q.state = to
		return nil
	case verbs.QPStateReset:
		if qh.opened {
			// As the real seam refuses it: mlx5 writes a doorbell
			// record on reset that an opened handle lacks.
			return opErr(op, syscall.EINVAL)
		}
		q.state, q.destQPN, q.remote, q.rts = to, 0, netip.Addr{}, false
		if q.sendq != nil {
			// The provider cleans the QP's completions out of its CQ
			// and resets the queue's indices (mlx5_modify_qp:
			// mlx5_cq_clean, mlx5_init_qp_indices; mlx4 and hns
			// alike): what was not polled never completes, sends
			// waiting for a receive are dropped, and the whole send
			// queue is free.
			clear(q.sendq.items)
			q.sendq.items = q.sendq.items[:0]
			q.rnr, q.lost = nil, 0
		}
		return nil
	case verbs.QPStateInit, verbs.QPStateRTR, verbs.QPStateRTS:
	default:
		return opErr(op, syscall.EINVAL)
	}
	if q.state == verbs.QPStateErr || q.state > to {
		return opErr(op, syscall.EINVAL)
	}
	if err := p.deviceErr(op); err != nil {
		// RST2INIT, INIT2RTR, RTR2RTS, and a move to the state it is
		// in (INIT2INIT, RTS2RTS; the real seam's QUERY_QP); 2ERR and
		// 2RST succeed.
		return err
	}
	// Every step's attributes come from the CM id (rdma_init_qp_attr): the
	// port, P_Key index and access flags of INIT from a connected-mode id,
	// the path of RTR and the timeouts of RTS from one whose exchange is
	// live. A SIDR id's attributes (a Q_Key, no access flags) fit no XRC
	// QP.
	if q.state == to {
		return nil
	}
	if via == 0 {
		return opErr("rdma_init_qp_attr", syscall.EINVAL)
	}
	id, err := lookup[*cmid](p, "rdma_init_qp_attr", uint64(via))
	if err != nil {
		return err
	}
	if !id.ex.Connected() {
		return opErr("rdma_init_qp_attr", syscall.EINVAL)
	}
	// cm_init_qp_init_attr takes an id from REQ_SENT to ESTABLISHED (a
	// listener, an id rejected back to idle or in timewait: EINVAL);
	// cm_init_qp_rtr_attr and _rts_attr from REQ_RCVD.
	live := id.state == csReqRcvd || id.state == csRepSent || id.state == csRepRcvd || id.state == csEstablished
	for q.state < to {
		next := q.state + 1
		if !live && (next >= verbs.QPStateRTR || id.state != csReqSent) {
			return opErr("rdma_init_qp_attr", syscall.EINVAL)
		}
		if next == verbs.QPStateRTR {
			if id.remoteQPN == 0 || !id.remote.IsValid() {
				return opErr("rdma_init_qp_attr", syscall.EINVAL)
			}
			q.destQPN, q.remote = id.remoteQPN, id.remote.Addr()
		}
		q.state = next
	}
	q.rts = q.rts || q.state == verbs.QPStateRTS
	return nil
}

func (p *Process) PostSend(h kernel.QP, wrs []kernel.SendWR) error {
	const op = "ibv_post_send"
	p.lock()
	defer p.unlock()
	qh, err := lookup[*qpHandle](p, op, uint64(h))
	if err != nil {
		return err
	}
	q := qh.q
	if q.typ != verbs.QPTypeXRCSend {
		return opErr(op, syscall.EINVAL)
	}
	if !q.rts || (q.state != verbs.QPStateRTS && q.state != verbs.QPStateErr) {
		return opErr(op, syscall.EINVAL)
	}
	for _, wr := range wrs {
		// A full send queue refuses the rest of the chain; the QP stays as
		// it is (mlx5_wq_overflow: a slot is free once its completion is
		// polled). Sends waiting for a receive (RNR) hold their slots.
		if len(q.sendq.items)+len(q.rnr)+q.lost >= p.n.sqDepth {
			return opErr(op, syscall.ENOMEM)
		}
		if p.n.failed {
			// mlx5 posts on a device in its internal error state as on
			// a live one (its post_send does not look at the state), and
			// the device, dead, never writes a completion: not even a
			// flush, which the kernel makes for its own consumers only.
			q.lost++
			continue
		}
		st, wait := verbs.WCWRFlushErr, len(q.rnr) > 0 // in order behind those waiting
		if q.state == verbs.QPStateRTS && !wait {
			st, wait = q.deliver(wr)
		}
		if wait {
			wr.Payload = bytes.Clone(wr.Payload)
			q.rnr = append(q.rnr, wr)
			p.n.f.rnr[q] = struct{}{}
			continue
		}
		q.complete(wr.WRID, st)
	}
	return nil
}

// complete ends one send with st. A send that fails on an INI in RTS moves
// it to ERR: one error flushes everything behind it.
func (q *qp) complete(wrid uint64, st verbs.WCStatus) {
	if st != verbs.WCSuccess && q.state == verbs.QPStateRTS {
		q.state = verbs.QPStateErr
	}
	q.sendq.push(kernel.SendCompletion{WRID: wrid, Status: st, QPNum: q.num})
}

// deliver carries one send from an INI to the SRQ it names, through the TGT
// the INI is connected to; wait: the SRQ has no receive posted (RNR).
func (q *qp) deliver(wr kernel.SendWR) (_ verbs.WCStatus, wait bool) {
	dst := q.n.f.nodeAt(q.remote)
	if dst == nil || dst.off || q.n.off {
		return verbs.WCRetryExcErr, false
	}
	t := dst.qps[q.destQPN]
	// A TGT that is gone, not ready, or now belongs to another connection
	// (reused number) drops the packets: the sender retries and gives up.
	if t == nil || t.typ != verbs.QPTypeXRCRecv || (t.state != verbs.QPStateRTR && t.state != verbs.QPStateRTS) ||
		t.destQPN != q.num || t.remote != q.n.addr {
		return verbs.WCRetryExcErr, false
	}
	// Any SRQ of the TGT's domain, by the number the sender names.
	s := dst.srqs[wr.RemoteSRQN]
	if s == nil || s.d != t.d {
		return verbs.WCRemInvReqErr, false
	}
	// No receive posted: the responder NAKs before it looks at the length.
	if s.cap > 0 && len(s.recv.items) >= s.cap {
		dst.rnrNAKs++
		return verbs.WCSuccess, true
	}
	if len(wr.Payload) > s.slot {
		// The receive it took is too short: it completes in error (a
		// local length error), the responder (the TGT) goes to ERR, and
		// the sender is NAKed (rxe_resp.c: RESPST_ERR_LENGTH, a class C
		// error: do_class_ac_error, then rxe_qp_error).
		// (An error completion's immediate data is not valid:
		// ibv_poll_cq(3). It carries none here.)
		s.recv.push(kernel.RecvCompletion{TGTQPN: t.num, Status: verbs.WCLocLenErr})
		t.state = verbs.QPStateErr
		return verbs.WCRemInvReqErr, false
	}
	s.recv.push(kernel.RecvCompletion{TGTQPN: t.num, Imm: wr.Imm, Payload: clonePayload(wr.Payload), Status: verbs.WCSuccess})
	return verbs.WCSuccess, false
}

func (p *Process) PollSend(ctx context.Context, h kernel.QP, out []kernel.SendCompletion) (int, error) {
	return poll(ctx, p, "ibv_poll_cq", func() (*queue[kernel.SendCompletion], error) {
		qh, err := lookup[*qpHandle](p, "ibv_poll_cq", uint64(h))
		if err != nil {
			return nil, err
		}
		if qh.q.sendq == nil {
			return nil, opErr("ibv_poll_cq", syscall.EINVAL)
		}
		return qh.q.sendq, nil
	}, nil, out)
}

func (p *Process) PollRecv(ctx context.Context, h kernel.SRQ, out []kernel.RecvCompletion) (int, error) {
	var s *srq
	return poll(ctx, p, "ibv_poll_cq", func() (*queue[kernel.RecvCompletion], error) {
		var err error
		if s, err = lookup[*srq](p, "ibv_poll_cq", uint64(h)); err != nil {
			return nil, err
		}
		if p.recvPaused {
			return &p.resumed, nil // never holds an item; signalled on resume
		}
		return &s.recv, nil
	}, func() bool { return p.recvPaused && s != nil && len(s.recv.items) > 0 }, out)
}

// Kill is the process's death; the same as Close.
func (p *Process) Kill() { p.Close() }

// Dead is closed once the process has died (Kill, Close, its node's
// PowerOff): what it held is gone, and its calls fail with ErrClosed.
func (p *Process) Dead() <-chan struct{} { return p.done }

// Close releases everything, as process exit does: CM ids first (with the
// DREQs and REJs the kernel sends for them), then QP handles, SRQs and
// domains, regardless of EBUSY.
func (p *Process) Close() error {
	p.lock()
	defer p.unlock()
	if p.closed {
		return nil
	}
	hs := make([]uint64, 0, len(p.handles))
	for h := range p.handles {
		hs = append(hs, h)
	}
	slices.Sort(hs) // deterministic order
	for _, h := range hs {
		if id, ok := p.handles[h].(*cmid); ok {
			p.destroyID(id)
			delete(p.handles, h)
		}
	}
	for _, h := range hs {
		switch o := p.handles[h].(type) {
		case *qpHandle:
			p.destroyQP(o)
			delete(p.handles, h)
		}
	}
	for _, h := range hs {
		if s, ok := p.handles[h].(*srq); ok {
			p.destroySRQ(s)
			delete(p.handles, h)
		}
	}
	for _, h := range hs {
		if x, ok := p.handles[h].(*xrcdHandle); ok {
			x.d.unref()
			delete(p.handles, h)
		}
	}
	p.closed = true
	close(p.done)
	p.n.procs = slices.DeleteFunc(p.n.procs, func(x *Process) bool { return x == p })
	return nil
}

// clonePayload copies a sent payload into a receive buffer, as the device
// writes it into one of the SRQ's.
func clonePayload(p []byte) []byte {
	b := kernel.NewPayload(len(p))
	copy(b, p)
	return b
}
