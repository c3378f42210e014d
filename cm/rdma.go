package cm

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/goxrc/goxrc/rdmacm"
	"github.com/goxrc/goxrc/verbs"
)

// Work request ids: receive slots are their own index, send slots are
// tagged, one-sided operations use rdmaWRID.
const sendWRTag = 1 << 33

// minRNRTimer replaces rdma_init_qp_attr's 0, which means a 655 ms back-off
// (facts.md); 12 is 0.64 ms. Credits mean RNR should never happen at all.
const minRNRTimer = 12

// rdmaTransport is a Conn's RC queue pair with its buffers, on a CM id the
// transport owns.
type rdmaTransport struct {
	id  *rdmacm.ID
	ch  *chanRef // the event channel the id lives on
	dev *device
	cc  *verbs.CompChannel
	cq  *verbs.CQ
	qp  *verbs.QP
	mr  *verbs.MR

	sendSlots, recvSlots int
	sendSize, recvSize   int
	inline               int

	sendWR  [1]verbs.SendWR // posts are serialised by the Conn's postMu
	sendSGE [1]verbs.SGE
	recvMu  sync.Mutex
	recvWR  []verbs.RecvWR // one chain of up to recvSlots
	recvSGE []verbs.SGE
	wcs     []verbs.WorkCompletion // the polling leader's

	mu           sync.Mutex // guards the QP's life against shutdown
	released     bool
	shut         bool
	events       chan struct{} // closed when the CM id's watcher ends
	disconnected chan struct{}
	onPeerGone   func(reason string)
}

// chanRef counts the users of an event channel: a listener's channel carries
// the ids of the connections it accepted, which outlive the listener.
type chanRef struct {
	ch   *rdmacm.EventChannel
	dial bool // the shared dialer channel, counted under dialChan's lock
	mu   sync.Mutex
	refs int
}

func newChanRef() (*chanRef, error) {
	ch, err := rdmacm.NewEventChannel()
	if err != nil {
		return nil, err
	}
	return &chanRef{ch: ch, refs: 1}, nil
}

func (r *chanRef) acquire() *chanRef {
	r.mu.Lock()
	r.refs++
	r.mu.Unlock()
	return r
}

func (r *chanRef) release() error {
	if r.dial {
		return releaseDialChan()
	}
	r.mu.Lock()
	r.refs--
	last := r.refs == 0
	r.mu.Unlock()
	if last {
		return r.ch.Close()
	}
	return nil
}

// dialChan is the event channel every Dial shares while any dialed
// connection lives: one pump and one descriptor instead of one per dial,
// which is most of what setting up a connection costs in user space.
var dialChan struct {
	sync.Mutex
	ref *chanRef
}

func acquireDialChan() (*chanRef, error) {
	dialChan.Lock()
	defer dialChan.Unlock()
	if dialChan.ref != nil {
		dialChan.ref.refs++
		return dialChan.ref, nil
	}
	r, err := newChanRef()
	if err != nil {
		return nil, err
	}
	r.dial = true
	dialChan.ref = r
	return r, nil
}

func releaseDialChan() error {
	dialChan.Lock()
	defer dialChan.Unlock()
	r := dialChan.ref
	r.refs--
	if r.refs > 0 {
		return nil
	}
	dialChan.ref = nil
	return r.ch.Close()
}

// device is the process's context and protection domain on one RDMA device,
// shared by every connection on it. verbs objects must come from one
// context wrapper to be used together, so the first id's wrapper serves all.
type device struct {
	name string
	ctx  *verbs.Context
	pd   *verbs.PD
	refs int
}

var devices struct {
	sync.Mutex
	m map[string]*device
}

func acquireDevice(id *rdmacm.ID) (*device, error) {
	name := id.DeviceName()
	devices.Lock()
	defer devices.Unlock()
	if devices.m == nil {
		devices.m = map[string]*device{}
	}
	if d := devices.m[name]; d != nil {
		d.refs++
		return d, nil
	}
	vctx := id.Context()
	if vctx == nil {
		return nil, errors.New("CM id is not bound to an RDMA device")
	}
	pd, err := vctx.AllocPD()
	if err != nil {
		vctx.Close()
		return nil, err
	}
	d := &device{name: name, ctx: vctx, pd: pd, refs: 1}
	devices.m[name] = d
	return d, nil
}

func (d *device) release() {
	devices.Lock()
	defer devices.Unlock()
	d.refs--
	if d.refs == 0 {
		delete(devices.m, d.name)
		d.pd.Close()
		d.ctx.Close()
	}
}

// newRDMATransport creates the queue pair and its buffers on the device id
// is bound to and moves the QP to INIT. Buffers: sendSlots of sendSize
// bytes, then recvSlots of recvSize, in one registration.
func newRDMATransport(id *rdmacm.ID, sendSlots, recvSlots, sendSize, recvSize, inline int) (_ *rdmaTransport, err error) {
	t := &rdmaTransport{
		id: id, sendSlots: sendSlots, recvSlots: recvSlots,
		sendSize: sendSize, recvSize: recvSize,
		events: make(chan struct{}), disconnected: make(chan struct{}),
		recvWR: make([]verbs.RecvWR, recvSlots), recvSGE: make([]verbs.SGE, recvSlots),
	}
	defer func() {
		if err != nil {
			t.free()
		}
	}()
	if t.dev, err = acquireDevice(id); err != nil {
		return nil, err
	}
	vctx := t.dev.ctx
	if t.cc, err = vctx.NewCompChannel(); err != nil {
		return nil, err
	}
	cqe := sendSlots + recvSlots + 1
	if t.cq, err = vctx.CreateCQ(cqe, t.cc, 0); err != nil {
		return nil, err
	}
	t.wcs = make([]verbs.WorkCompletion, cqe)
	qpCap := verbs.QPCap{
		MaxSendWR: uint32(sendSlots + 1), MaxRecvWR: uint32(recvSlots),
		MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: uint32(inline),
	}
	t.qp, err = t.dev.pd.CreateQP(verbs.QPInit{Type: verbs.QPTypeRC, SendCQ: t.cq, RecvCQ: t.cq, Cap: qpCap})
	if err != nil && inline > 0 {
		// Some devices inline less than asked: go without.
		qpCap.MaxInlineData = 0
		t.qp, err = t.dev.pd.CreateQP(verbs.QPInit{Type: verbs.QPTypeRC, SendCQ: t.cq, RecvCQ: t.cq, Cap: qpCap})
	}
	if err != nil {
		return nil, err
	}
	globalStats.qps.Add(1)
	t.inline = min(inline, int(t.qp.Cap().MaxInlineData))
	size := sendSlots*sendSize + recvSlots*recvSize
	if t.mr, err = t.dev.pd.RegMR(size, verbs.AccessLocalWrite); err != nil {
		return nil, err
	}
	if err = t.modify(verbs.QPStateInit); err != nil {
		return nil, err
	}
	return t, nil
}

// modify moves the QP to state with the attributes the CM computed.
func (t *rdmaTransport) modify(state verbs.QPState) error {
	attr, mask, err := t.id.InitQPAttr(state)
	if err != nil {
		return err
	}
	if state == verbs.QPStateRTR {
		attr.MinRNRTimer = minRNRTimer
		mask |= verbs.QPAttrMinRNRTimer
	}
	return t.qp.Modify(&attr, mask)
}

// connect moves the QP through RTR to RTS once the peer's QP number is known.
func (t *rdmaTransport) connect() error {
	if err := t.modify(verbs.QPStateRTR); err != nil {
		return err
	}
	return t.modify(verbs.QPStateRTS)
}

func (t *rdmaTransport) sendBuf(slot int) []byte {
	off := slot * t.sendSize
	return t.mr.Bytes()[off : off+t.sendSize]
}

func (t *rdmaTransport) recvBuf(slot int) []byte {
	off := t.sendSlots*t.sendSize + slot*t.recvSize
	return t.mr.Bytes()[off : off+t.recvSize]
}

func (t *rdmaTransport) postSend(slot, n int, imm uint32, hasImm, signaled bool) error {
	wr := &t.sendWR[0]
	*wr = verbs.SendWR{ID: sendWRTag | uint64(slot), Opcode: verbs.WRSend, Imm: imm}
	if signaled {
		wr.Flags = verbs.SendSignaled
	}
	if hasImm {
		wr.Opcode = verbs.WRSendWithImm
	}
	if n <= t.inline {
		wr.Inline = t.sendBuf(slot)[:n]
	} else {
		t.sendSGE[0] = t.mr.SGE(slot*t.sendSize, n)
		wr.SGL = t.sendSGE[:]
	}
	return t.qp.PostSend(t.sendWR[:])
}

func (t *rdmaTransport) postRecvs(slots []int) error {
	t.recvMu.Lock()
	defer t.recvMu.Unlock()
	for len(slots) > 0 {
		k := min(len(slots), len(t.recvWR))
		for i, slot := range slots[:k] {
			t.recvSGE[i] = t.mr.SGE(t.sendSlots*t.sendSize+slot*t.recvSize, t.recvSize)
			t.recvWR[i] = verbs.RecvWR{ID: uint64(slot), SGL: t.recvSGE[i : i+1]}
		}
		if err := t.qp.PostRecv(t.recvWR[:k]); err != nil {
			return err
		}
		slots = slots[k:]
	}
	return nil
}

type rdmaMem struct{ mr *verbs.MR }

func (m *rdmaMem) bytes() []byte { return m.mr.Bytes() }
func (m *rdmaMem) addr() uint64  { return m.mr.Addr() }
func (m *rdmaMem) rkey() uint32  { return m.mr.RKey() }
func (m *rdmaMem) close() error  { return m.mr.Close() }

func (t *rdmaTransport) regMem(size int, remoteWrite bool) (memory, error) {
	access := verbs.AccessLocalWrite | verbs.AccessRemoteRead
	if remoteWrite {
		access |= verbs.AccessRemoteWrite
	}
	mr, err := t.dev.pd.RegMR(size, access)
	if err != nil {
		return nil, err
	}
	return &rdmaMem{mr: mr}, nil
}

func (t *rdmaTransport) postRDMA(write bool, local *Region, off, n int, remote RemoteRegion, roff uint64) error {
	m, ok := local.mem.(*rdmaMem)
	if !ok {
		return errors.New("region belongs to another transport")
	}
	op := verbs.WRRDMARead
	if write {
		op = verbs.WRRDMAWrite
	}
	return t.qp.PostSend([]verbs.SendWR{{
		ID: rdmaWRID, Opcode: op, Flags: verbs.SendSignaled,
		SGL:        []verbs.SGE{m.mr.SGE(off, n)},
		RemoteAddr: remote.Addr + roff, RKey: remote.RKey,
	}})
}

func (t *rdmaTransport) poll(ctx context.Context, cs []completion, block bool) (int, error) {
	wcs := t.wcs[:min(len(cs), len(t.wcs))]
	var n int
	var err error
	if block {
		n, err = t.cq.Wait(ctx, wcs)
	} else {
		n, err = t.cq.Poll(wcs)
	}
	for i := 0; i < n; i++ {
		wc := &wcs[i]
		c := &cs[i]
		*c = completion{n: int(wc.ByteLen), imm: wc.Imm, hasImm: wc.Flags&verbs.WCWithImm != 0}
		switch {
		case wc.WRID == rdmaWRID:
			c.op = compRDMA
		case wc.WRID&sendWRTag != 0:
			c.op, c.slot = compSend, int(wc.WRID&^sendWRTag)
		default:
			c.op, c.slot = compRecv, int(wc.WRID)
		}
		if wc.Status != verbs.WCSuccess {
			c.err = wc.Err()
		}
	}
	return n, err
}

// shutdown moves the QP to the error state, flushing everything posted.
func (t *rdmaTransport) shutdown() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.released || t.shut || t.qp == nil {
		return
	}
	t.shut = true
	t.qp.Modify(&verbs.QPAttr{State: verbs.QPStateErr}, verbs.QPAttrState)
}

// watch reads the CM id's events for the life of the connection: a
// disconnect from the peer breaks the Conn; TIMEWAIT_EXIT ends the watch.
func (t *rdmaTransport) watch() {
	defer close(t.events)
	disconnected := false
	for {
		ev, err := t.id.Event(context.Background())
		if err != nil {
			return // the id was closed
		}
		switch ev.Type {
		case rdmacm.EventDisconnected:
			if !disconnected {
				disconnected = true
				close(t.disconnected)
				// Answer the peer's DREQ at once, or it waits for the
				// DREP to time out before its time-wait can start.
				t.id.Disconnect()
				if t.onPeerGone != nil {
					t.onPeerGone("peer disconnected")
				}
			}
		case rdmacm.EventDeviceRemoval:
			if t.onPeerGone != nil {
				t.onPeerGone("RDMA device removed")
			}
		case rdmacm.EventTimewaitExit:
			return
		}
	}
}

// release disconnects, waits until the CM leaves time-wait (so the QP
// number is not reused while the peer may still know it), and frees all.
func (t *rdmaTransport) release(ctx context.Context) error {
	t.shutdown()
	err := t.id.Disconnect()
	select {
	case <-t.events:
	case <-ctx.Done():
		err = errors.Join(err, fmt.Errorf("waiting for the CM to leave time-wait: %w", ctx.Err()))
	}
	t.mu.Lock()
	t.released = true
	t.mu.Unlock()
	return errors.Join(err, t.free())
}

// free destroys everything in reverse order of creation. It also cleans up
// after a failed handshake, where any field may be nil.
func (t *rdmaTransport) free() error {
	var errs []error
	if t.id != nil {
		errs = append(errs, t.id.Close())
	}
	if t.qp != nil {
		errs = append(errs, t.qp.Close())
		globalStats.qps.Add(-1)
	}
	if t.mr != nil {
		errs = append(errs, t.mr.Close())
	}
	if t.cq != nil {
		errs = append(errs, t.cq.Close())
	}
	if t.cc != nil {
		errs = append(errs, t.cc.Close())
	}
	if t.dev != nil {
		t.dev.release()
	}
	if t.ch != nil {
		errs = append(errs, t.ch.release())
	}
	return errors.Join(errs...)
}
