package model

import (
	"cmp"
	"context"
	"maps"
	"net/netip"
	"os"
	"slices"
	"sync"
	"syscall"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/verbs"
)

// Reuse is how freed QP and SRQ numbers come back.
type Reuse uint8

const (
	// ReuseLIFO hands out the most recently freed number first: the
	// adversarial case (a just-freed TGT number is the next one created).
	ReuseLIFO Reuse = iota
	// ReuseLowest hands out the lowest free number.
	ReuseLowest
	// ReuseNever never reuses a number.
	ReuseNever
)

const (
	firstQPN  = 0x11 // above the special QPs and clearly not small indices
	firstSRQN = 0x21
	ephemeral = 40000
)

// Fabric is a set of nodes that reach each other by IP address. One mutex
// guards everything: the model is about semantics, not speed, and a single
// lock makes every interleaving a sequence of whole kernel operations.
type Fabric struct {
	mu     sync.Mutex
	nodes  map[netip.Addr]*Node
	reuse  Reuse
	nextH  uint64
	nextID int
	rnr    map[*qp]struct{} // INIs whose sends wait for a receive (NodeConfig.SRQReceives)
}

// NewFabric returns an empty fabric whose nodes reuse numbers by policy.
func NewFabric(reuse Reuse) *Fabric {
	return &Fabric{nodes: map[netip.Addr]*Node{}, reuse: reuse, rnr: map[*qp]struct{}{}}
}

// NodeConfig configures a node.
type NodeConfig struct {
	NoXRC bool // a device without XRC (like rxe): OpenXRCD and CreateINI fail with EOPNOTSUPP
	// SendQueueDepth is each INI's max_send_wr: PostSend fails with ENOMEM
	// while that many sends wait to be polled (default DefaultSendQueueDepth).
	SendQueueDepth int
	// SRQReceives is how many receives each SRQ of the node holds posted:
	// a message takes one, and its completion, once polled, gives it back
	// (internal/kernel/real reposts as it polls). A message that finds none
	// left is refused with an RNR NAK, which the INI retries for ever
	// (rnr_retry 7): it waits at the INI, every later send of that INI
	// behind it, until the receiver polls. 0: unlimited, no RNR.
	SRQReceives int
}

// DefaultSendQueueDepth is an INI's send queue depth unless NodeConfig says
// otherwise: the real kernel's default (internal/kernel/real, Options.SendWR).
const DefaultSendQueueDepth = 256

// AddNode adds a node (one device, one port) at addr.
func (f *Fabric) AddNode(addr netip.Addr, cfg NodeConfig) *Node {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.nodeAt(addr) != nil {
		panic("model: duplicate node address " + addr.String())
	}
	if cfg.SendQueueDepth <= 0 {
		cfg.SendQueueDepth = DefaultSendQueueDepth
	}
	n := &Node{
		f: f, addr: addr, xrc: !cfg.NoXRC, sqDepth: cfg.SendQueueDepth, srqRecvs: cfg.SRQReceives,
		qpns:      numbers{next: firstQPN, policy: f.reuse},
		srqns:     numbers{next: firstSRQN, policy: f.reuse},
		qps:       map[uint32]*qp{},
		srqs:      map[uint32]*srq{},
		stale:     map[staleKey]*cmid{},
		listeners: map[listenKey]*cmid{},
		nextPort:  ephemeral,
	}
	f.nodes[nodeKey(addr)] = n
	return n
}

// nodeAt returns the node at addr, nil if none: an IPv4-mapped address is
// the IPv4 node's, and a zone names the one link a link-local address is
// on, as a device's CM reads them ("fe80::1%eth0" is node fe80::1).
func (f *Fabric) nodeAt(addr netip.Addr) *Node { return f.nodes[nodeKey(addr)] }

func nodeKey(addr netip.Addr) netip.Addr { return addr.Unmap().WithZone("") }

func (f *Fabric) handle() uint64 { f.nextH++; return f.nextH }

// Node is one host with one RDMA device.
type Node struct {
	f         *Fabric
	addr      netip.Addr
	xrc       bool
	sqDepth   int // an INI's max_send_wr
	srqRecvs  int // receives posted per SRQ; 0: unlimited
	rnrNAKs   uint64
	qpns      numbers
	srqns     numbers
	qps       map[uint32]*qp // live QPs (INI and TGT objects, not handles)
	srqs      map[uint32]*srq
	xrcds     []*xrcd
	stale     map[staleKey]*cmid // ib_cm's remote (node, QPN) table
	listeners map[listenKey]*cmid
	nextPort  uint16
	procs     []*Process
	off       bool // PowerOff or FailDevice: sends nothing, answers nothing
	failed    bool // FailDevice
}

// Addr is the node's address.
func (n *Node) Addr() netip.Addr { return n.addr }

// NewProcess starts a process on the node; it implements kernel.Kernel.
func (n *Node) NewProcess() *Process {
	n.f.mu.Lock()
	defer n.f.mu.Unlock()
	n.f.nextID++
	p := &Process{n: n, pid: n.f.nextID, handles: map[uint64]any{}, done: make(chan struct{}), fatal: make(chan struct{}), resumed: newQueue[kernel.RecvCompletion]()}
	if n.failed {
		close(p.fatal)
	}
	n.procs = append(n.procs, p)
	return p
}

// FailDevice makes the node's device fail for good, as a firmware fault does
// (IBV_EVENT_DEVICE_FATAL): every process on the node learns of it from
// DeviceFatal, one started later at once; the node sends nothing and
// answers nothing, as after PowerOff, but its processes live on and must
// let go of what they hold themselves: destroying and moving QPs to ERR or
// RESET work, what takes a firmware command fails with EIO (creating a QP,
// an SRQ or a domain, moving a QP up, querying it), opening a TGT or an
// existing domain works (mlx5_internal_err_ret_value; ib_open_qp sends no
// command); the CM calls that send a message fail with EIO (a DREQ's
// rdma_disconnect returns 0 and no event follows). Its sends fail as sends
// to a node that is off do, and nothing more arrives at its SRQs.
func (n *Node) FailDevice() {
	n.f.mu.Lock()
	defer n.f.mu.Unlock()
	if n.failed {
		return
	}
	n.off, n.failed = true, true
	for _, p := range n.procs {
		close(p.fatal)
	}
	n.f.retryRNR() // sends waiting for its receives fail now
}

// PowerOff takes the node off the fabric as a power cut or a pulled cable
// does: its processes die without sending anything (no DREQ, no REJ), and
// from now on a REQ or SIDR REQ to it gets no answer (the requester's own
// timeout ends it), a DREQ to it times out at once (DISCONNECTED, then
// TIMEWAIT_EXIT, as IB_CM_DREQ_ERROR does, without the retries' wait), and
// a send to it fails with WCRetryExcErr, as the sender's retries running out
// do. The node stays off: a process started on it later reaches nothing.
func (n *Node) PowerOff() {
	n.f.mu.Lock()
	n.off = true
	procs := slices.Clone(n.procs)
	n.f.mu.Unlock()
	for _, p := range procs {
		p.Close()
	}
}

// QPCount is the number of live QP objects on the node (INI and TGT, each
// TGT once however many handles it has): what the QP-count tests compare.
func (n *Node) QPCount() (ini, tgt int) {
	c := n.Counts()
	return c.INIs, c.TGTs
}

// Counts are the node's counts of Node.QPCount, TGTHandleTotal, XRCDs and
// RNRNAKs, taken together.
type Counts struct {
	INIs, TGTs, TGTHandles, XRCDs int
	RNRNAKs                       uint64
}

// Counts returns the node's counts as one state of the node: under one
// hold of the fabric's lock, so that no operation falls between them (each
// live TGT has a handle and holds its domain in every state; read one by
// one, a TGT destroyed between the reads showed with no handle or no
// domain).
func (n *Node) Counts() Counts {
	n.f.mu.Lock()
	defer n.f.mu.Unlock()
	c := Counts{XRCDs: len(n.xrcds), RNRNAKs: n.rnrNAKs}
	for _, q := range n.qps {
		if q.typ == verbs.QPTypeXRCSend {
			c.INIs++
		} else {
			c.TGTs++
			c.TGTHandles += q.handles
		}
	}
	return c
}

// RNRNAKs is the number of times a message to one of the node's SRQs found
// no receive posted (NodeConfig.SRQReceives): one for each try, a message
// refused until the receiver polls counting as often as it was tried.
func (n *Node) RNRNAKs() uint64 {
	n.f.mu.Lock()
	defer n.f.mu.Unlock()
	return n.rnrNAKs
}

// TGTHandles is the kernel use count of the TGT numbered qpn (0 if none).
func (n *Node) TGTHandles(qpn uint32) int {
	n.f.mu.Lock()
	defer n.f.mu.Unlock()
	if q := n.qps[qpn]; q != nil && q.typ == verbs.QPTypeXRCRecv {
		return q.handles
	}
	return 0
}

// TGTHandleTotal is the sum of the kernel use counts of every live TGT on
// the node: the node-wide registration count, 0 when no process holds any.
func (n *Node) TGTHandleTotal() int { return n.Counts().TGTHandles }

// XRCDs is the number of live XRC domains on the node.
func (n *Node) XRCDs() int {
	n.f.mu.Lock()
	defer n.f.mu.Unlock()
	return len(n.xrcds)
}

// StaleEntries is the size of the node's stale-connection table.
func (n *Node) StaleEntries() int {
	n.f.mu.Lock()
	defer n.f.mu.Unlock()
	return len(n.stale)
}

// numbers allocates QPNs or SRQNs with a reuse policy.
type numbers struct {
	next   uint32
	free   []uint32
	policy Reuse
}

func (a *numbers) get() uint32 {
	if len(a.free) > 0 {
		i := len(a.free) - 1
		if a.policy == ReuseLowest {
			i = 0
			for j, v := range a.free {
				if v < a.free[i] {
					i = j
				}
			}
		}
		v := a.free[i]
		a.free = slices.Delete(a.free, i, i+1)
		return v
	}
	v := a.next
	a.next++
	return v
}

func (a *numbers) put(v uint32) {
	if a.policy != ReuseNever {
		a.free = append(a.free, v)
	}
}

// xrcd is a node's XRC domain, bound to an inode (or private).
type xrcd struct {
	n    *Node
	file *os.File    // held open so that the inode cannot be freed and reused
	fi   os.FileInfo // nil for a private domain
	refs int         // process handles + TGT QPs + SRQs, like xrcd->usecnt
}

func (d *xrcd) unref() {
	d.refs--
	if d.refs > 0 {
		return
	}
	d.n.xrcds = slices.DeleteFunc(d.n.xrcds, func(x *xrcd) bool { return x == d })
	if d.file != nil {
		d.file.Close()
	}
}

// xrcdHandle is one process's opening of a domain.
type xrcdHandle struct {
	d    *xrcd
	uses int // QPs and SRQs made or opened through this handle (EBUSY)
}

type srq struct {
	num  uint32
	slot int // bytes per receive
	cap  int // receives posted (NodeConfig.SRQReceives); 0: unlimited
	d    *xrcd
	via  *xrcdHandle
	recv queue[kernel.RecvCompletion]
}

type qp struct {
	n       *Node
	num     uint32
	typ     verbs.QPType
	state   verbs.QPState
	destQPN uint32
	remote  netip.Addr
	d       *xrcd // TGT only
	handles int   // TGT: kernel use count
	sendq   *queue[kernel.SendCompletion]
	// INI: it reached RTS since its last reset. The real seam refuses
	// posts before that, in ERR too (internal/kernel/real, qpObj.rts).
	rts bool
	// INI: sends refused for want of a receive (RNR), retried in order
	// by retryRNR, with every later send behind them.
	rnr []kernel.SendWR
	// lost: sends on a failed device, which never complete and keep
	// their send queue slots (see Node.FailDevice).
	lost int
}

type qpHandle struct {
	q      *qp
	via    *xrcdHandle // TGT only
	opened bool        // by OpenTGT: another process's TGT (the real seam cannot reset it)
}

// queue is an event or completion queue that waiters block on outside the
// fabric lock: wake has room for one token, closed ends every wait.
type queue[T any] struct {
	items  []T
	wake   chan struct{}
	closed chan struct{}
}

func newQueue[T any]() queue[T] {
	return queue[T]{wake: make(chan struct{}, 1), closed: make(chan struct{})}
}

func (q *queue[T]) push(x T) {
	q.items = append(q.items, x)
	q.signal()
}

func (q *queue[T]) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

func (q *queue[T]) close() {
	select {
	case <-q.closed:
	default:
		close(q.closed)
	}
}

// poll waits until q (found by lookup under the lock) has items, and moves
// up to len(out) of them into out. A poll whose deadline passes while
// stalled (under the lock) holds returns EINTR, not the deadline's error,
// which says the queue was found empty: a paused process's is not. Ended by
// its context, it looks once more (lookup again: the pause may have ended
// since), so that it returns the deadline's error only for a queue it found
// empty.
func poll[T any](ctx context.Context, p *Process, op string, lookup func() (*queue[T], error), stalled func() bool, out []T) (int, error) {
	if len(out) == 0 {
		return 0, opErr(op, syscall.EINVAL)
	}
	f := p.n.f
	for ended := false; ; {
		f.mu.Lock()
		q, err := lookup()
		if err != nil {
			f.mu.Unlock()
			return 0, err
		}
		if len(q.items) > 0 {
			k := copy(out, q.items)
			// Shift the rest down rather than reslice, so that the
			// array is reused and pushes do not allocate.
			rest := copy(q.items, q.items[k:])
			clear(q.items[rest:])
			q.items = q.items[:rest]
			if len(q.items) > 0 {
				q.signal() // another waiter may take the rest
			}
			f.retryRNR() // receives taken from an SRQ are posted again
			f.mu.Unlock()
			return k, nil
		}
		if ended {
			held := stalled != nil && ctx.Err() == context.DeadlineExceeded && stalled()
			f.mu.Unlock()
			if held {
				return 0, opErr(op, syscall.EINTR)
			}
			return 0, ctx.Err()
		}
		wake, closed := q.wake, q.closed
		f.mu.Unlock()
		select {
		case <-wake:
		case <-closed:
		case <-p.done:
		case <-ctx.Done():
			ended = true
		}
	}
}

func opErr(op string, errno syscall.Errno) error { return &verbs.OpError{Op: op, Err: errno} }

// retryRNR delivers, in order, the sends that INIs hold for want of a
// receive, as far as receives allow; under f.mu, after every operation
// that may have changed what they wait for. An INI in ERR flushes them, one
// reset or destroyed drops them; a send that now fails (its TGT, SRQ or
// node gone) fails as at post time, and flushes the rest.
func (f *Fabric) retryRNR() {
	if len(f.rnr) == 0 {
		return
	}
	waiting := slices.SortedFunc(maps.Keys(f.rnr), func(a, b *qp) int {
		if c := a.n.addr.Compare(b.n.addr); c != 0 {
			return c
		}
		return cmp.Compare(a.num, b.num)
	})
	for _, q := range waiting {
		if q.n.failed {
			// The device that held them is dead: they never complete.
			q.lost += len(q.rnr)
			q.rnr = nil
			delete(f.rnr, q)
			continue
		}
		for len(q.rnr) > 0 {
			if q.n.qps[q.num] != q || q.state == verbs.QPStateReset {
				q.rnr = nil
				break
			}
			st := verbs.WCWRFlushErr
			if q.state == verbs.QPStateRTS {
				var wait bool
				if st, wait = q.deliver(q.rnr[0]); wait {
					break
				}
			}
			q.complete(q.rnr[0].WRID, st)
			q.rnr[0] = kernel.SendWR{}
			q.rnr = q.rnr[1:]
		}
		if len(q.rnr) == 0 {
			q.rnr = nil
			delete(f.rnr, q)
		}
	}
}
