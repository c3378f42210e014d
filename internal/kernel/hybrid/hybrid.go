// Package hybrid is a kernel.Kernel whose CM is the real one and whose XRC
// objects are the model's: Listen, Connect, Accept, Reject, Establish,
// Disconnect, DestroyID and Event go to librdmacm (internal/kernel/kcm:
// XRC-typed ids on RDMA_PS_IB, SIDR on RDMA_PS_UDP, one port number), while
// XRC domains, SRQs, INI and TGT QPs and the data path come from a process of
// internal/kernel/model. The QP numbers the real CM carries are the model's
// made-up numbers. It runs the XRC engine's CM exchanges on a device without
// XRC verbs (soft-RoCE).
//
// One Fabric holds one model node per real node (device address), and every
// Process of a node shares it, so QP numbers are unique node-wide across both
// roles, as the kernel's stale-connection table (keyed by remote GUID and
// QPN) needs when both ends run on one rxe node. The model numbers QPs from
// 0x11 up, where rxe numbers its real QPs; the numbers a Process shows (and
// the CM carries) are the model's plus QPNOffset, modulo 2^24, so they cannot
// collide with real QPs or with the made-up numbers of other tests. Each
// further node's shown numbers start nodeQPNSpan higher, so that two nodes
// that are two addresses of one device do not collide either.
//
// Moving a QP to RTR takes the path from the real CM id: the peer's QP number
// and address are replayed to the model through a private model CM exchange
// (on model port ShadowPort, serialised per Fabric), so that the model's
// TransitionQP sets the same path rdma_init_qp_attr would. Data flows only
// between processes of one Fabric (one OS process): the model carries it.
//
// Builds without Linux or cgo compile, and NewProcess fails with an error
// matching verbs.ErrNotSupported (rdmacm has no event channel there).
package hybrid

import (
	"context"
	"net/netip"
	"sync"
	"syscall"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/internal/kernel/kcm"
	"github.com/goxrc/goxrc/internal/kernel/model"
	"github.com/goxrc/goxrc/verbs"
)

// QPNOffset is added (mod 2^24) to every model QP number a Process of the
// first node shows; each further node's numbers start nodeQPNSpan higher, so
// that two nodes on one real device (two addresses of it) show different
// numbers: the kernel CM keys connections by device and QP number, and drops
// a REQ that repeats one.
const QPNOffset = 0x700000

// nodeQPNSpan is how many model QP numbers a node has before its shown
// numbers reach the next node's.
const nodeQPNSpan = 0x10000

// ShadowPort is the model port of the private exchanges that set QP paths.
const ShadowPort = 1

// toWire is the number a model QP numbered m shows on a node whose
// numbers start at off (Fabric.offset).
func toWire(m, off uint32) uint32 {
	if m == 0 {
		return 0
	}
	return (m + off) & 0xFFFFFF
}

func toModel(w, off uint32) uint32 {
	if w == 0 {
		return 0
	}
	return (w - off) & 0xFFFFFF
}

// Fabric is the model side of a set of real nodes: one model node per device
// address.
type Fabric struct {
	f       *model.Fabric
	mu      sync.Mutex
	nodes   map[netip.Addr]*model.Node
	offsets map[netip.Addr]uint32          // what toWire adds, by node
	helpers map[*model.Node]*model.Process // the shadow exchanges' far ends
	shadow  sync.Mutex
}

// NewFabric returns a fabric whose model reuses numbers by policy.
func NewFabric(reuse model.Reuse) *Fabric {
	return &Fabric{f: model.NewFabric(reuse), nodes: map[netip.Addr]*model.Node{}, offsets: map[netip.Addr]uint32{},
		helpers: map[*model.Node]*model.Process{}}
}

// Node returns the model node of the real node at addr, adding it on first use.
func (f *Fabric) Node(addr netip.Addr) *model.Node {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.nodeLocked(addr)
}

func (f *Fabric) nodeLocked(addr netip.Addr) *model.Node {
	addr = nodeKey(addr)
	n := f.nodes[addr]
	if n == nil {
		n = f.f.AddNode(addr, model.NodeConfig{})
		f.offsets[addr] = QPNOffset + uint32(len(f.nodes))*nodeQPNSpan
		f.nodes[addr] = n
	}
	return n
}

// offset is what toWire adds to the numbers of the node at addr.
func (f *Fabric) offset(addr netip.Addr) uint32 {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nodeLocked(addr)
	return f.offsets[nodeKey(addr)]
}

// nodeKey is addr as one node's key: "fe80::1%eth0" and "fe80::1" (and
// "::ffff:10.0.0.1" and "10.0.0.1") are one node, as they are to the engine
// (xrc's sameNode), not two with numbers of their own.
func nodeKey(addr netip.Addr) netip.Addr { return addr.Unmap().WithZone("") }

func (f *Fabric) helper(addr netip.Addr) *model.Process {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.nodeLocked(addr)
	h := f.helpers[n]
	if h == nil {
		h = n.NewProcess()
		f.helpers[n] = h
	}
	return h
}

// Process is one process on a real node: a kernel.Kernel.
type Process struct {
	f       *Fabric
	off     uint32 // toWire's offset for this process's node
	m       *model.Process
	*kcm.CM // the CM half: Listen, Connect, Accept, Reject, Establish, Disconnect, DestroyID, Event
}

var _ kernel.Kernel = (*Process)(nil)

// NewProcess starts a process on the real node whose RDMA device has address
// local: its CM ids are real (one event channel), its XRC objects live on the
// model node of local.
func (f *Fabric) NewProcess(local netip.Addr) (*Process, error) {
	local = local.Unmap()
	cm, err := kcm.New(local)
	if err != nil {
		return nil, err
	}
	return &Process{f: f, off: f.offset(local), m: f.Node(local).NewProcess(), CM: cm}, nil
}

// Handles is the number of model handles and real CM ids p holds.
func (p *Process) Handles() int { return p.m.Handles() + p.CM.Len() }

// Model is the model process behind p (for counts in tests).
func (p *Process) Model() *model.Process { return p.m }

func (p *Process) LocalAddr() netip.Addr { return p.m.LocalAddr() }
func (p *Process) XRC() bool             { return p.m.XRC() }

func (p *Process) OpenXRCD(path string, flags kernel.XRCDFlags) (kernel.XRCD, error) {
	return p.m.OpenXRCD(path, flags)
}
func (p *Process) CloseXRCD(d kernel.XRCD) error { return p.m.CloseXRCD(d) }
func (p *Process) CreateSRQ(d kernel.XRCD, slot int) (kernel.SRQ, uint32, error) {
	return p.m.CreateSRQ(d, slot)
}
func (p *Process) DestroySRQ(s kernel.SRQ) error { return p.m.DestroySRQ(s) }

func (p *Process) CreateINI() (kernel.QP, uint32, error) {
	return p.shown(p.m.CreateINI())
}

func (p *Process) CreateTGT(d kernel.XRCD) (kernel.QP, uint32, error) {
	return p.shown(p.m.CreateTGT(d))
}

// shown gives a new model QP its shown number, or destroys it and fails
// with ENOSPC once the node's numbers are used up: the next one would show
// as the next node's (ReuseNever numbers only grow).
func (p *Process) shown(q kernel.QP, n uint32, err error) (kernel.QP, uint32, error) {
	if err != nil {
		return q, 0, err
	}
	if n >= nodeQPNSpan {
		p.m.DestroyQP(q)
		return 0, 0, &verbs.OpError{Op: "ibv_create_qp", Addr: "hybrid node numbers used up", Err: syscall.ENOSPC}
	}
	return q, toWire(n, p.off), nil
}

func (p *Process) OpenTGT(d kernel.XRCD, qpn uint32) (kernel.QP, error) {
	return p.m.OpenTGT(d, toModel(qpn, p.off))
}

func (p *Process) DestroyQP(q kernel.QP) error { return p.m.DestroyQP(q) }

func (p *Process) QueryQP(q kernel.QP) (kernel.QPInfo, error) {
	info, err := p.m.QueryQP(q)
	info.Num = toWire(info.Num, p.off)
	if info.DestQPN != 0 { // a QP of the peer's node; none before RTR
		info.DestQPN = toWire(info.DestQPN, p.f.offset(info.Remote))
	}
	return info, err
}

// TransitionQP moves q up to `to`, its attributes from the real CM id via: its peer's QP number and address are set on the model QP by a
// private model exchange that mirrors the real one.
func (p *Process) TransitionQP(q kernel.QP, to verbs.QPState, via kernel.ID) error {
	if to == verbs.QPStateErr || to == verbs.QPStateReset {
		return p.m.TransitionQP(q, to, 0) // no query: a failed device refuses it, not these
	}
	info, err := p.m.QueryQP(q)
	if err != nil {
		return err
	}
	// Moves up take their attributes from a CM id, in the model as on the
	// device: the model's comes from a shadow exchange.
	needID := to >= verbs.QPStateInit && to <= verbs.QPStateRTS && info.State < to
	if !needID {
		return p.m.TransitionQP(q, to, 0)
	}
	path, err := p.CM.PathOf(via, to)
	if err != nil {
		return err
	}
	return p.f.withPath(p.m, info, path, func(id kernel.ID) error { return p.m.TransitionQP(q, to, id) })
}

// withPath runs fn with a model CM id of process pm whose peer is the model
// QP numbered path.RemoteQPN at path.Remote's node, then tears the exchange
// down (no model stale-table entry outlives it).
func (f *Fabric) withPath(pm *model.Process, info kernel.QPInfo, path kcm.Path, fn func(kernel.ID) error) error {
	f.shadow.Lock()
	defer f.shadow.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	local, remote := pm.LocalAddr(), nodeKey(path.Remote.Addr())
	hp := f.helper(remote)
	peer := toModel(path.RemoteQPN, f.offset(remote))
	if info.Type == verbs.QPTypeXRCSend {
		// INI: an active model id whose REP named the peer's TGT.
		l, err := hp.Listen(netip.AddrPortFrom(remote, ShadowPort), kernel.ExchangeXRC)
		if err != nil {
			return err
		}
		defer hp.DestroyID(l)
		a, err := pm.Connect(ctx, netip.AddrPortFrom(remote, ShadowPort), kernel.ExchangeXRC, info.Num, nil)
		if err != nil {
			return err
		}
		defer pm.DestroyID(a)
		ev, err := hp.Event(ctx, l)
		if err != nil {
			return err
		}
		if ev.Type != kernel.EventConnectRequest {
			return &verbs.OpError{Op: "rdma_init_qp_attr", Addr: "shadow " + ev.Type.String(), Err: syscall.EPROTO}
		}
		defer hp.DestroyID(ev.ID)
		if err := hp.Accept(ev.ID, peer, nil); err != nil {
			return err
		}
		return fn(a)
	}
	// TGT: a passive model id whose REQ named the peer's INI.
	l, err := pm.Listen(netip.AddrPortFrom(local, ShadowPort), kernel.ExchangeXRC)
	if err != nil {
		return err
	}
	defer pm.DestroyID(l)
	a, err := hp.Connect(ctx, netip.AddrPortFrom(local, ShadowPort), kernel.ExchangeXRC, peer, nil)
	if err != nil {
		return err
	}
	defer hp.DestroyID(a)
	ev, err := pm.Event(ctx, l)
	if err != nil {
		return err
	}
	if ev.Type != kernel.EventConnectRequest {
		return &verbs.OpError{Op: "rdma_init_qp_attr", Addr: "shadow " + ev.Type.String(), Err: syscall.EPROTO}
	}
	defer pm.DestroyID(ev.ID)
	return fn(ev.ID)
}

// DeviceFatal is the model device's (Node.FailDevice): the real device
// under the CM half has no verbs context here to report one.
func (p *Process) DeviceFatal() <-chan struct{} { return p.m.DeviceFatal() }

func (p *Process) PostSend(q kernel.QP, wrs []kernel.SendWR) error { return p.m.PostSend(q, wrs) }

func (p *Process) PollSend(ctx context.Context, q kernel.QP, out []kernel.SendCompletion) (int, error) {
	n, err := p.m.PollSend(ctx, q, out)
	for i := range out[:n] {
		out[i].QPNum = toWire(out[i].QPNum, p.off)
	}
	return n, err
}

func (p *Process) PollRecv(ctx context.Context, s kernel.SRQ, out []kernel.RecvCompletion) (int, error) {
	n, err := p.m.PollRecv(ctx, s, out)
	for i := range out[:n] {
		out[i].TGTQPN = toWire(out[i].TGTQPN, p.off)
	}
	return n, err
}

// Close releases everything: the real CM ids first (with what the kernel
// sends for them), then the model objects.
func (p *Process) Close() error {
	err := p.CM.Close()
	if err2 := p.m.Close(); err == nil {
		err = err2
	}
	return err
}
