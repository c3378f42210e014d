package cm

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/goxrc/goxrc/rdmacm"
	"github.com/goxrc/goxrc/verbs"
)

// Work request ids: receive slots are their own index, send slots are
// tagged, one-sided operations use rdmaWRID.
const sendWRTag = 1 << 33

// minRNRTimer replaces rdma_init_qp_attr's 0, which means a 655 ms back-off
// (facts.md); 12 is 0.64 ms. Credits mean RNR should never happen at all.
const minRNRTimer = 12

// readDepth is how many RDMA reads a connection lets its peer have in
// flight to it, and asks for its own: a one-sided read and a keepalive
// probe take turns.
const readDepth = 1

// dialerMoves are the active side's QP moves: the CM's attributes, which
// come from the peer's reply, but for the RNR timer.
var dialerMoves = rdmacm.MoveParams{MinRNRTimer: minRNRTimer}

// rdmaTransport is a Conn's RC queue pair with its buffers, on a CM id the
// transport owns.
type rdmaTransport struct {
	id      *rdmacm.ID
	ch      *chanRef // the event channel the id lives on
	dev     *device
	cq      *verbs.CQ
	wake    chan struct{} // a token when the CQ had an event; closed by free
	watched bool          // the device's pump knows wake
	armed   bool          // the CQ is armed and its event not yet taken (the polling leader's)
	qp      *verbs.QP
	mem     regBlock // the buffers, from the device's pool
	hasMem  bool

	sendSlots, recvSlots int
	sendSize, recvSize   int
	inline               int
	maxMsg               int // the port's max_msg_sz (maxMessage); 0 if unknown

	sendWR   [1]verbs.SendWR // posts are serialised by the Conn's postMu
	sendSGE  [1]verbs.SGE
	rdmaWR   [1]verbs.SendWR // one-sided posts, serialised by the Conn's rdmaTurn
	rdmaSGE  [1]verbs.SGE
	probeWR  [1]verbs.SendWR // keepalive probes, posted by the keepalive loop alone
	probeSGE [1]verbs.SGE
	recvMu   sync.Mutex
	recvWR   []verbs.RecvWR // one chain of up to recvSlots
	recvSGE  []verbs.SGE
	wcs      []verbs.WorkCompletion // the polling leader's

	shape        qpShape     // the sizes the QP and CQ were made for (qpcache.go)
	timewaitDone bool        // release saw the CM leave time-wait: the pair may be reused
	cqBroken     atomic.Bool // the device reported CQ_ERR: the CQ takes no more completions (async.go)
	cqKept       bool        // free gave the QP and CQ back to the device
	mu           sync.Mutex  // guards the QP's life against shutdown
	released     bool
	shut         bool
	interrupted  bool          // interrupt's wake-up not yet taken by a wait
	watching     bool          // start began the CM id's watcher
	events       chan struct{} // closed when the CM id's watcher ends
	settled      chan struct{} // closed when the id left time-wait, or never will (the watcher's say)
	sawTimewait  bool          // the watcher saw TIMEWAIT_EXIT (read after settled closes)
	noTimewait   bool          // the watcher saw where no TIMEWAIT_EXIT will come (likewise)
	disconnected chan struct{}
	onPeerGone   func(reason string)
	// onDeviceRemoved: the device went away (the watcher ends after it).
	onDeviceRemoved func()
	// onAsync: a device event about the QP, the CQ or port (async.go),
	// while registered with the device. It returns the writing of the
	// event's log records, which the device's reader calls once every
	// connection the event concerns has heard of it.
	onAsync func(verbs.AsyncEvent) (log func())
	port    uint8
	inAsync bool // registered with the device for its events
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
	if errors.Is(err, syscall.ENODEV) || errors.Is(err, syscall.ENOENT) {
		// The kernel has no RDMA CM at all: say what to do about it.
		return nil, fmt.Errorf("%w: no RDMA here (%w); WithFabric runs cm on an in-memory fabric", ErrNotSupported, err)
	}
	if err != nil {
		return nil, err
	}
	return &chanRef{ch: ch, refs: 1}, nil
}

func (r *chanRef) acquire() *chanRef {
	if r.dial {
		dialChan.Lock()
		r.refs++
		dialChan.Unlock()
		return r
	}
	r.mu.Lock()
	r.refs++
	r.mu.Unlock()
	return r
}

func (r *chanRef) release() error {
	if r.dial {
		return releaseDialChan(r)
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
	if r := dialChan.ref; r != nil {
		if r.ch.Err() == nil {
			r.refs++
			return r, nil
		}
		// Broken: its connections have failed and let go of it in time;
		// new dials get a channel of their own.
		dialChan.ref = nil
	}
	r, err := newChanRef()
	if err != nil {
		return nil, err
	}
	r.dial = true
	dialChan.ref = r
	return r, nil
}

func releaseDialChan(r *chanRef) error {
	dialChan.Lock()
	defer dialChan.Unlock()
	r.refs--
	if r.refs > 0 {
		return nil
	}
	if dialChan.ref == r {
		dialChan.ref = nil
	}
	return r.ch.Close()
}

// device is the process's context and protection domain on one RDMA device,
// shared by every connection on it. verbs objects must come from one
// context wrapper to be used together, so the first id's wrapper serves all.
type device struct {
	name      string
	anchor    anchor
	ctx       *verbs.Context
	pd        *verbs.PD
	pool      *regPool
	refs      int // under devices' lock, as is listeners
	listeners int // listeners holding the device: it keeps closed connections' QPs (qpcache.go)

	// One completion channel serves the CQs of every connection on the
	// device: its reader (pump) wakes the connection whose CQ had an event.
	cc       *verbs.CompChannel
	pumpDone chan struct{}
	mu       sync.Mutex
	wakes    map[*verbs.CQ]chan struct{}
	ccErr    error // the channel failed: no wake-ups come any more

	// Keepalive probes (WithKeepalive) read a peer's target into
	// probeSink; peers read probeTarget, which they may read and nothing
	// else: its probeLen bytes are zeros.
	probeTarget, probeSink *verbs.MR

	qps       map[qpShape][]cachedQP // closed connections' QPs and CQs (qpcache.go)
	cachedQPs int
	// deadPairs counts the pairs the event reader took out of the cache
	// and is destroying (cqErrLocked); added to under mu. The reader
	// holds no reference: closeLocked waits for them before the PD, the
	// channel and the context, which refuse to go while they live.
	deadPairs sync.WaitGroup

	// The device's asynchronous events (async.go): asyncDone is closed when
	// their reader ends (nil if they could not be read; closeLocked does
	// not wait for it, only tests do); conns, under mu, are the connections they may
	// concern; portDown, under mu, the ports last reported down; fatal is
	// closed, under mu, when DEVICE_FATAL came.
	asyncDone chan struct{}
	conns     map[*rdmaTransport]struct{}
	portDown  map[uint8]bool
	fatal     chan struct{}

	maxMsgs map[uint8]int // the ports' max_msg_sz, under mu: read once (maxMessage)

	// gone: an id on the device reported its removal (see removed); under
	// devices' lock, as are idle and idleGen.
	gone bool
	// idle runs out the device's idle time after its last user let go
	// (release); idleGen tells a timer that fired late from the current one.
	idle    *time.Timer
	idleGen uint64
}

// maxMessage is port's max_msg_sz, 0 if unknown; a port's does not
// change, so it is read once, not once per connection.
func (d *device) maxMessage(port uint8) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if m, ok := d.maxMsgs[port]; ok {
		return m
	}
	a, err := d.ctx.QueryPort(port)
	if err != nil {
		return 0
	}
	if d.maxMsgs == nil {
		d.maxMsgs = map[uint8]int{}
	}
	m := int(min(a.MaxMsgSize, math.MaxInt32)) // 2 GiB, on a 32-bit int
	d.maxMsgs[port] = m
	return m
}

// deviceIdle is how long a device nobody uses stays open: a process that
// only dials, one connection at a time, would otherwise open it and
// register its buffers again for every connection (the pool's kept
// registrations go with the device). CloseIdleDevices closes it at once.
const deviceIdle = bigIdle

var devices struct {
	sync.Mutex
	m map[string]*device
}

// anchor is a CM id of the device's own, bound to its address and
// destroyed after everything else on the device. librdmacm closes a
// removed device's context with the last id on it, as soon as it notices
// the device gone (a later call that meets another device); the verbs
// objects the device keeps between connections (its PD, buffers, cached
// QPs, a Region's memory) must be destroyed before that, whatever order the
// connections' ids go in.
type anchor struct {
	ch *rdmacm.EventChannel
	id *rdmacm.ID
}

// newAnchor binds an anchor to the address of, an id on the device. An
// address that leads to another device (one address on two devices) gives
// no anchor, and no error: the device works without one, but is not kept
// idle (see release).
func newAnchor(of *rdmacm.ID) (anchor, error) {
	ch, err := rdmacm.NewEventChannel()
	if err != nil {
		return anchor{}, err
	}
	id, err := ch.CreateID(rdmacm.PortSpaceTCP, verbs.QPTypeRC)
	if err == nil {
		if err = id.Bind(netip.AddrPortFrom(of.LocalAddr().Addr(), 0)); err != nil {
			id.Close()
		}
	}
	if err != nil {
		ch.Close()
		return anchor{}, err
	}
	a := anchor{ch: ch, id: id}
	if id.DeviceName() != of.DeviceName() {
		a.close()
		return anchor{}, nil
	}
	return a, nil
}

// regProbes registers a device's two probe buffers (see probeLen).
func regProbes(pd *verbs.PD) (target, sink *verbs.MR, err error) {
	if target, err = pd.RegMR(probeLen, verbs.AccessRemoteRead); err != nil {
		return nil, nil, err
	}
	if sink, err = pd.RegMR(probeLen, verbs.AccessLocalWrite); err != nil {
		target.Close()
		return nil, nil, err
	}
	return target, sink, nil
}

func (a anchor) close() {
	if a.id != nil {
		a.id.Close()
		a.ch.Close()
	}
}

func acquireDevice(id *rdmacm.ID) (*device, error) {
	name := id.DeviceName()
	devices.Lock()
	defer devices.Unlock()
	if devices.m == nil {
		devices.m = map[string]*device{}
	}
	if d := devices.m[name]; d != nil {
		d.takeLocked()
		return d, nil
	}
	anchor, err := newAnchor(id)
	if err != nil {
		return nil, err
	}
	vctx := id.VerbsContext()
	if vctx == nil {
		anchor.close()
		return nil, errors.New("CM id is not bound to an RDMA device")
	}
	pd, err := vctx.AllocPD()
	if err != nil {
		vctx.Close()
		anchor.close()
		return nil, err
	}
	cc, err := vctx.NewSharedCompChannel()
	if err != nil {
		pd.Close()
		vctx.Close()
		anchor.close()
		return nil, err
	}
	target, sink, err := regProbes(pd)
	if errors.Is(err, syscall.ENOMEM) && reclaimLockedMemoryLocked(nil) {
		// Another device, idle or keeping buffers, may hold the
		// process's lockable memory (see reclaimLockedMemory).
		target, sink, err = regProbes(pd)
	}
	if err != nil {
		cc.Close()
		pd.Close()
		vctx.Close()
		anchor.close()
		return nil, err
	}
	d := &device{
		name: name, anchor: anchor, ctx: vctx, pd: pd, pool: newRegPool(pd), refs: 1,
		probeTarget: target, probeSink: sink,
		cc: cc, pumpDone: make(chan struct{}), wakes: map[*verbs.CQ]chan struct{}{},
		qps: map[qpShape][]cachedQP{}, conns: map[*rdmaTransport]struct{}{},
		portDown: map[uint8]bool{}, fatal: make(chan struct{}),
	}
	d.pool.reclaim = d.reclaimLockedMemory
	globalStats.devices.Add(1)
	if anchor.id != nil {
		go d.watchAnchor(anchor.id)
	}
	go d.pump()
	if events := vctx.AsyncEvents(); events != nil {
		d.asyncDone = make(chan struct{})
		go d.readAsync(events)
	}
	devices.m[name] = d
	return d, nil
}

// watchAnchor hears of the device's removal through the anchor, the one id
// an idle device has; it ends when the anchor closes.
func (d *device) watchAnchor(id *rdmacm.ID) {
	for {
		ev, err := id.Event(context.Background())
		if err != nil {
			return
		}
		if ev.Type == rdmacm.EventDeviceRemoval {
			d.removed()
			return
		}
	}
}

// pump reads the completion channel for the life of the device and wakes
// the connection whose CQ had an event. It waits in the netpoller; closing
// the channel ends it.
func (d *device) pump() {
	defer close(d.pumpDone)
	var cqs [64]*verbs.CQ
	for {
		n, err := d.cc.GetEvents(context.Background(), cqs[:])
		d.mu.Lock()
		if err != nil {
			// Closed with the device (no CQ is left then), or broken:
			// every waiter wakes and sees ccErr.
			d.ccErr = err
			for _, w := range d.wakes {
				notify(w)
			}
			d.mu.Unlock()
			return
		}
		for _, q := range cqs[:n] {
			if w := d.wakes[q]; w != nil {
				notify(w)
			}
		}
		d.mu.Unlock()
	}
}

// notify leaves a wake-up token unless one is waiting already.
func notify(w chan struct{}) {
	select {
	case w <- struct{}{}:
	default:
	}
}

// watchCQ makes the pump wake w on q's events.
func (d *device) watchCQ(q *verbs.CQ, w chan struct{}) {
	d.mu.Lock()
	d.wakes[q] = w
	d.mu.Unlock()
}

// unwatchCQ stops the wake-ups and closes w, which wakes a waiter for good.
func (d *device) unwatchCQ(q *verbs.CQ, w chan struct{}) {
	d.mu.Lock()
	delete(d.wakes, q)
	d.mu.Unlock()
	close(w)
}

func (d *device) channelErr() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.ccErr
}

// takeLocked takes a reference, ending the device's idle time.
func (d *device) takeLocked() {
	d.refs++
	if d.idle != nil {
		d.idle.Stop() // if it fired already, expire sees idleGen moved on
		d.idle = nil
		d.idleGen++
		globalStats.devicesIdle.Add(-1)
	}
}

// hold takes one more reference on a device already held.
func (d *device) hold() {
	devices.Lock()
	d.takeLocked()
	devices.Unlock()
}

// holdForListener takes a reference for a listener, which keeps closed
// connections' QPs on the device (qpcache.go) until dropListener. It
// reports false, taking nothing, for a device that was removed.
func (d *device) holdForListener() bool {
	devices.Lock()
	defer devices.Unlock()
	if d.gone {
		return false
	}
	d.takeLocked()
	d.listeners++
	return true
}

// dropListener gives back a listener's reference. The last listener takes
// the cached QPs with it: a process that only dials keeps none (putQP), and
// its dialed connections or regions may hold the device for long.
func (d *device) dropListener() {
	devices.Lock()
	d.listeners--
	last := d.listeners == 0
	devices.Unlock()
	if last {
		d.dropQPs()
	}
	d.release()
}

// release gives back a reference. The last one starts the device's idle
// time (deviceIdle), at whose end it closes, unless it was removed.
func (d *device) release() {
	devices.Lock()
	defer devices.Unlock()
	d.refs--
	if d.refs > 0 {
		return
	}
	if d.gone || d.anchor.id == nil {
		// With no anchor nothing hears of a removal, and the id of the
		// connection that let the device go, destroyed next, may be the
		// last one holding librdmacm's context: it is not kept.
		d.closeLocked()
		return
	}
	d.idleGen++
	gen := d.idleGen
	d.idle = time.AfterFunc(deviceIdle, func() { d.expire(gen) })
	globalStats.devicesIdle.Add(1)
}

// expire closes the device at the end of the idle time gen began, unless
// a user came back in the meantime.
func (d *device) expire(gen uint64) {
	devices.Lock()
	defer devices.Unlock()
	if d.idle != nil && d.idleGen == gen {
		d.closeIdleLocked()
	}
}

// closeIdleLocked ends the device's idle time and closes it.
func (d *device) closeIdleLocked() {
	d.endIdleLocked()
	d.closeLocked()
}

func (d *device) endIdleLocked() {
	d.idle.Stop()
	d.idle = nil
	d.idleGen++
	globalStats.devicesIdle.Add(-1)
}

// CloseIdleDevices closes at once every RDMA device that no connection,
// listener or registered region uses. cm keeps such a device open, with
// its protection domain and the buffer memory registered for connections,
// for ten seconds after its last user let go, so that a process that
// dials again soon does not open and register it all again. Call it before
// counting what a process holds, or to give back locked memory now.
func CloseIdleDevices() {
	devices.Lock()
	defer devices.Unlock()
	for _, d := range devices.m {
		if d.idle != nil {
			d.closeIdleLocked()
		}
	}
}

// reclaimLockedMemory gives back the lockable memory (RLIMIT_MEMLOCK) that
// cm keeps for later connections, for a registration, CQ or QP on d that
// the kernel refused for want of it: every device's kept registrations and
// cached QPs (dropKept), and every idle device but d, with all its buffers.
// The limit is the process's, not a device's. It reports whether anything
// was given back. The caller holds no pool's lock.
func (d *device) reclaimLockedMemory() bool {
	freed := d.dropKept()
	devices.Lock()
	defer devices.Unlock()
	return reclaimLockedMemoryLocked(d) || freed
}

// reclaimLockedMemoryLocked gives back what every device but except keeps:
// idle ones close, the others drop what they keep (dropKept).
func reclaimLockedMemoryLocked(except *device) (freed bool) {
	for _, o := range devices.m {
		switch {
		case o == except:
		case o.idle != nil:
			o.closeIdleLocked()
			freed = true
		default:
			freed = o.dropKept() || freed
		}
	}
	return freed
}

// dropKept gives back what a device in use keeps for later connections and
// which pins lockable memory: the pool's kept registrations, and the cached
// QPs and CQs (their queues are pinned too). It reports whether there was
// any.
func (d *device) dropKept() bool {
	regs := d.pool.dropKept()
	qps := d.dropQPs()
	return regs || qps
}

// withReclaim runs create, and once more after reclaimLockedMemory gave
// something back where the kernel refused it for want of lockable memory.
func (d *device) withReclaim(create func() error) error {
	err := create()
	if errors.Is(err, syscall.ENOMEM) && d.reclaimLockedMemory() {
		err = create()
	}
	return err
}

// closeLocked destroys everything the device holds; no reference is left.
func (d *device) closeLocked() {
	if devices.m[d.name] == d {
		delete(devices.m, d.name)
	}
	d.dropQPs()
	d.deadPairs.Wait()
	if d.cc.Close() == nil {
		<-d.pumpDone
	}
	d.pool.close()
	d.probeTarget.Close()
	d.probeSink.Close()
	d.pd.Close()
	// A closed context ends the async events; their reader ends once it
	// has delivered those already read, not waited for: delivering runs
	// the application's logger (WithLogger), which must not hold devices'
	// lock, and with it every Dial, Listen and release of the process.
	d.ctx.Close()
	// last: see anchor. Its watcher ends on its own: it may be waiting for
	// devices' lock, held here, to report a removal.
	d.anchor.close()
	globalStats.devices.Add(-1)
}

// removed takes a device that is being removed out of use: an id that
// reaches a device of that name later (one added again) gets a new entry.
// Its objects go with its last user, with no idle time; an idle one
// closes now, in the background (closing destroys the device's objects
// under devices' lock; no caller needs to wait for that).
func (d *device) removed() {
	devices.Lock()
	defer devices.Unlock()
	d.gone = true
	if devices.m[d.name] == d {
		delete(devices.m, d.name)
	}
	if d.idle != nil {
		d.endIdleLocked()
		go func() {
			devices.Lock()
			defer devices.Unlock()
			d.closeLocked()
		}()
	}
}

// newRDMATransport creates the queue pair and its buffers on the device id
// is bound to and moves the QP to state: INIT on the active side, which does
// not know its peer yet; RTS at once on the passive side, whose request
// named the peer's QP. Buffers: sendSlots of sendSize bytes, then recvSlots
// of recvSize, in one registration.
func newRDMATransport(id *rdmacm.ID, state verbs.QPState, moves rdmacm.MoveParams, sendSlots, recvSlots, sendSize, recvSize, inline int) (_ *rdmaTransport, err error) {
	t := &rdmaTransport{
		id: id, sendSlots: sendSlots, recvSlots: recvSlots,
		sendSize: sendSize, recvSize: recvSize,
		events: make(chan struct{}), settled: make(chan struct{}), disconnected: make(chan struct{}),
		recvWR: make([]verbs.RecvWR, recvSlots), recvSGE: make([]verbs.SGE, recvSlots),
	}
	defer func() {
		if err != nil {
			if t.dev.failed() {
				// Nothing on it works any more: its EIO says only that.
				err = fmt.Errorf("%w: %w", ErrDeviceRemoved, err)
			}
			t.free()
		}
	}()
	if t.dev, err = acquireDevice(id); err != nil {
		return nil, err
	}
	vctx := t.dev.ctx
	if t.maxMsg = t.dev.maxMessage(id.Port()); t.maxMsg > 0 {
		// No slot longer than the device takes in one message: the
		// caller's fitDevice caps the message size to match.
		sendSize, recvSize = min(sendSize, t.maxMsg), min(recvSize, t.maxMsg)
		t.sendSize, t.recvSize = sendSize, recvSize
	}
	cqe := sendSlots + recvSlots + 2 // and a one-sided operation, a probe
	t.shape = qpShape{sendSlots, recvSlots, inline}
	// A CQ or QP the kernel refuses for want of lockable memory (its
	// queues are pinned) is tried once more after what cm keeps went.
	cached, ok := t.dev.takeQP(t.shape)
	if ok {
		t.cq = cached.cq
	} else if err = t.dev.withReclaim(func() (err error) {
		t.cq, err = vctx.CreateCQ(cqe, t.dev.cc, 0)
		return err
	}); err != nil {
		return nil, err
	}
	t.wake = make(chan struct{}, 1)
	t.dev.watchCQ(t.cq, t.wake)
	t.watched = true
	t.wcs = make([]verbs.WorkCompletion, cqe)
	if ok {
		t.qp = cached.qp
	} else {
		create := func(inline int) (err error) {
			qpCap := verbs.QPCap{
				MaxSendWR: uint32(sendSlots + 2), MaxRecvWR: uint32(recvSlots),
				MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: uint32(inline),
			}
			t.qp, err = t.dev.pd.CreateQP(verbs.QPInit{Type: verbs.QPTypeRC, SendCQ: t.cq, RecvCQ: t.cq, Cap: qpCap})
			return err
		}
		if err = t.dev.withReclaim(func() error {
			return createInline(inline, create)
		}); err != nil {
			return nil, err
		}
	}
	globalStats.qps.Add(1)
	t.inline = min(inline, int(t.qp.Cap().MaxInlineData))
	size := sendSlots*sendSize + recvSlots*recvSize
	if t.mem, err = t.dev.pool.get(size); err != nil {
		return nil, err
	}
	t.hasMem = true
	if err = t.id.MoveQP(t.qp, state, moves); err != nil {
		return nil, err
	}
	return t, nil
}

// createInline creates a QP with create, asking for inline bytes of inline
// data, and where the device refuses that size, for half as many until it
// takes one or none: devices inline less than asked, say their most only by
// refusing more with EINVAL (rxe's rxe_qp_chk_cap, mlx5's
// mlx5_calc_sq_size, mlx4's verify_sizes), and a message that fits what
// they took still goes inline. Nothing is kept for the next QP: EINVAL is
// no proof of the size (devices answer it for other limits too), and a
// size a QP got after a refusal of another kind would cap every later
// one. Any other failure (ENOMEM, which
// withReclaim answers, EAGAIN, ...) is no answer to the inline size: it is
// returned as it is, not tried again with less. Where even no inline data
// is refused, the error is the first one, with the last try's added where
// it differs.
func createInline(inline int, create func(inline int) error) error {
	first := create(inline)
	err := first
	for ask := inline; ask > 0 && errors.Is(err, syscall.EINVAL); {
		ask /= 2
		err = create(ask)
	}
	switch {
	case err == nil || err == first:
		return err
	case errors.Is(err, syscall.EINVAL):
		return first
	}
	return fmt.Errorf("%w (and with less inline data: %w)", first, err)
}

// connect moves the active side's QP through RTR to RTS once the peer's
// reply named its QP.
func (t *rdmaTransport) connect() error {
	return t.id.MoveQP(t.qp, verbs.QPStateRTS, dialerMoves)
}

func (t *rdmaTransport) maxMessage() int { return t.maxMsg }

func (t *rdmaTransport) sendBuf(slot int) []byte {
	off := slot * t.sendSize
	return t.mem.buf[off : off+t.sendSize : off+t.sendSize]
}

func (t *rdmaTransport) recvBuf(slot int) []byte {
	off := t.sendSlots*t.sendSize + slot*t.recvSize
	return t.mem.buf[off : off+t.recvSize : off+t.recvSize]
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
		t.sendSGE[0] = t.mem.sge(slot*t.sendSize, n)
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
			t.recvSGE[i] = t.mem.sge(t.sendSlots*t.sendSize+slot*t.recvSize, t.recvSize)
			t.recvWR[i] = verbs.RecvWR{ID: uint64(slot), SGL: t.recvSGE[i : i+1]}
		}
		if err := t.qp.PostRecv(t.recvWR[:k]); err != nil {
			return err
		}
		slots = slots[k:]
	}
	return nil
}

// rdmaMem is a Region's registration. It holds its device, whose PD it is
// registered on: a device released under it could close neither its PD nor
// its context, and release would wait for ever.
type rdmaMem struct {
	mr  *verbs.MR
	dev *device
}

func (m *rdmaMem) bytes() []byte { return m.mr.Bytes() }
func (m *rdmaMem) addr() uint64  { return m.mr.Addr() }
func (m *rdmaMem) rkey() uint32  { return m.mr.RKey() }
func (m *rdmaMem) close() error {
	if err := m.mr.Close(); err != nil {
		return err // still on the PD: the device stays held
	}
	m.dev.release()
	return nil
}

func (t *rdmaTransport) regMem(size int, grant Access) (memory, error) {
	access := verbs.AccessLocalWrite // ReadRemote writes into it
	if grant&RemoteRead != 0 {
		access |= verbs.AccessRemoteRead
	}
	if grant&RemoteWrite != 0 {
		access |= verbs.AccessRemoteWrite
	}
	// Buffers cm keeps may be what took the lockable memory.
	var mr *verbs.MR
	err := t.dev.withReclaim(func() (err error) {
		mr, err = t.dev.pd.RegMR(size, access)
		return err
	})
	if err != nil {
		return nil, err
	}
	t.dev.hold()
	return &rdmaMem{mr: mr, dev: t.dev}, nil
}

func (t *rdmaTransport) postRDMA(write bool, local *Region, off, n int, remote RemoteRegion, roff uint64) error {
	m, ok := local.mem.(*rdmaMem)
	if !ok {
		return notPostedError{fmt.Errorf("region belongs to another transport: %w", ErrInvalid)}
	}
	if m.dev != t.dev {
		return notPostedError{fmt.Errorf("region registered on device %s, connection on %s: %w", m.dev.name, t.dev.name, ErrInvalid)}
	}
	op := verbs.WRRDMARead
	if write {
		op = verbs.WRRDMAWrite
	}
	t.rdmaSGE[0] = m.mr.SGE(off, n)
	t.rdmaWR[0] = verbs.SendWR{
		ID: rdmaWRID, Opcode: op, Flags: verbs.SendSignaled, SGL: t.rdmaSGE[:],
		RemoteAddr: remote.Addr + roff, RKey: remote.RKey,
	}
	if n == 0 {
		t.rdmaWR[0].SGL = nil // a zero-length SGE means 2 GiB to some devices
	}
	return t.qp.PostSend(t.rdmaWR[:])
}

func (t *rdmaTransport) probeTarget() probeTarget {
	return probeTarget{addr: t.dev.probeTarget.Addr(), rkey: t.dev.probeTarget.RKey()}
}

func (t *rdmaTransport) postProbe(peer probeTarget) error {
	t.probeSGE[0] = t.dev.probeSink.SGE(0, probeLen)
	t.probeWR[0] = verbs.SendWR{
		ID: probeWRID, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled, SGL: t.probeSGE[:],
		RemoteAddr: peer.addr, RKey: peer.rkey,
	}
	return t.qp.PostSend(t.probeWR[:])
}

func (t *rdmaTransport) poll(ctx context.Context, cs []completion, spin time.Duration, block bool) (int, error) {
	wcs := t.wcs[:min(len(cs), len(t.wcs))]
	var n int
	var err error
	if block {
		n, err = t.wait(ctx, wcs)
	} else {
		n, err = t.cq.PollSpin(wcs, spin)
	}
	for i := 0; i < n; i++ {
		wc := &wcs[i]
		c := &cs[i]
		*c = completion{n: int(wc.ByteLen), imm: wc.Imm, hasImm: wc.Flags&verbs.WCWithImm != 0}
		switch {
		case wc.WRID == rdmaWRID:
			c.op = compRDMA
		case wc.WRID == probeWRID:
			c.op = compProbe
		case wc.WRID&sendWRTag != 0:
			c.op, c.slot = compSend, int(wc.WRID&^sendWRTag)
		default:
			c.op, c.slot = compRecv, int(wc.WRID)
			c.written = wc.Opcode == verbs.WCRecvRDMAWithImm
		}
		if wc.Status != verbs.WCSuccess {
			c.err = wc.Err()
		}
	}
	return n, err
}

// wait polls the CQ; with nothing there it arms the CQ, polls again (a
// completion may have come before the arming; the three in one C call), and
// sleeps until the device's channel pump wakes it, ctx ends or the
// transport is freed.
func (t *rdmaTransport) wait(ctx context.Context, wcs []verbs.WorkCompletion) (int, error) {
	for {
		var n int
		var err error
		if t.armed {
			n, err = t.cq.Poll(wcs)
		} else {
			n, t.armed, err = t.cq.PollOrArm(wcs)
		}
		if n > 0 || err != nil {
			return n, err
		}
		if err := t.dev.channelErr(); err != nil {
			return 0, err
		}
		select {
		case _, ok := <-t.wake:
			if !ok {
				return 0, ErrClosed
			}
			t.armed = false
			if t.woken() {
				// The Conn failed (shutdown pokes us) or is closing
				// (interrupt): the caller rechecks instead of waiting
				// for a flush or a completion that may never come.
				return 0, nil
			}
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
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
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

func (t *rdmaTransport) interrupt() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.released || t.wake == nil {
		return
	}
	t.interrupted = true
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// woken reports whether a wake-up came from shutdown or interrupt, taking
// interrupt's.
func (t *rdmaTransport) woken() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	woken := t.shut || t.interrupted
	t.interrupted = false
	return woken
}

// watch reads the CM id's events for the life of the connection: a
// disconnect from the peer breaks the Conn; TIMEWAIT_EXIT settles it (the
// QP may be reused), and the watch goes on until the id is destroyed: an
// id past its time-wait still hears of its device's removal, which must
// release a connection the application has not closed yet. It ended at
// TIMEWAIT_EXIT, and a connection whose peer had disconnected held its QP
// and the device until the application's Close
// (TestCMDeviceRemovalAfterEnds, rxe: DEVICE_REMOVAL is all it sends).
func (t *rdmaTransport) watch() {
	defer close(t.events)
	settled := false
	settle := func() {
		if !settled {
			settled = true
			close(t.settled)
		}
	}
	defer settle()
	disconnected := false
	ended := func(reason string) {
		if !disconnected {
			disconnected = true
			close(t.disconnected)
			if t.onPeerGone != nil {
				t.onPeerGone(reason)
			}
		}
	}
	for {
		ev, err := t.id.Event(context.Background())
		if err != nil {
			return // the id was closed, or its channel failed
		}
		switch ev.Type {
		case rdmacm.EventDisconnected:
			if !disconnected {
				// Answer the peer's DREQ at once, or it waits for the
				// DREP to time out before its time-wait can start.
				t.id.Disconnect()
			}
			ended("peer disconnected")
		case rdmacm.EventRejected, rdmacm.EventUnreachable, rdmacm.EventConnectError:
			// The peer destroyed its id before our RTU reached it (its
			// listener closed, or its handshake timed out): its CM
			// rejects, ours enters time-wait, and rdma_cm reports no
			// TIMEWAIT_EXIT for an id it never saw disconnect.
			t.noTimewait = true
			ended("peer abandoned the connection during its handshake (" + ev.Type.String() + ")")
			settle()
		case rdmacm.EventDeviceRemoval:
			// The kernel has destroyed its side of the id: no
			// time-wait follows.
			if t.onDeviceRemoved != nil {
				t.onDeviceRemoved()
			}
			return
		case rdmacm.EventTimewaitExit:
			t.sawTimewait = true
			settle()
		}
	}
}

// release disconnects, waits until the CM leaves time-wait (so the QP
// number is not reused while the peer may still know it), and frees all.
// With a vanished peer it does not wait: the CM would resend its DREQ to no
// one for as long as its retries last. Nor after a disconnect the CM
// refused, unless the peer's DREQ had already come: no time-wait follows. The kernel's CM finishes the
// disconnect and keeps the time-wait on its own; the QP is destroyed, not
// kept for reuse.
func (t *rdmaTransport) release(ctx context.Context, vanished bool) error {
	t.shutdown()
	err := t.id.Disconnect()
	if t.id.DeviceRemoved() {
		err = nil // nothing left to disconnect
	}
	if err != nil && !vanished {
		select {
		case <-t.settled:
		default:
			// No DREQ went and no time-wait began: none will but for
			// the peer's own DREQ. Release as from a vanished peer;
			// destroying the id has the kernel's CM disconnect and keep
			// the time-wait itself.
			vanished = true
		}
	}
	if !vanished {
		select {
		case <-t.settled:
			// Only after TIMEWAIT_EXIT may the QP number be used again.
			t.timewaitDone = t.sawTimewait
			if t.noTimewait {
				err = nil // the peer's reject ended it: nothing to disconnect
			}
		case <-ctx.Done():
			err = errors.Join(err, fmt.Errorf("waiting for the CM to leave time-wait: %w", ctx.Err()))
		}
	}
	t.mu.Lock()
	t.released = true
	t.mu.Unlock()
	err = errors.Join(err, t.free())
	if t.watching {
		<-t.events // the destroyed id's queue closed: the watcher ends
	}
	return err
}

// free destroys everything in reverse order of creation, except the CM id,
// which goes last: librdmacm closes the context of a device it has found
// gone (it reads the device list again when an id reaches a device it does
// not know) with the last id on it, and nothing may be left on the context
// then. It also cleans up after a failed handshake, where any field may be
// nil.
func (t *rdmaTransport) free() error {
	var errs []error
	if t.dev != nil && t.id.DeviceRemoved() {
		t.dev.removed()
	}
	if t.watched {
		// Before the pair may go back to the device, where another
		// connection could watch its CQ at once.
		t.dev.unwatchCQ(t.cq, t.wake)
		t.watched = false
	}
	qpGone := true
	if t.qp != nil {
		globalStats.qps.Add(-1)
		if t.timewaitDone && t.dev.putQP(t.shape, t.qp, t.cq, t.wcs, &t.cqBroken) {
			// Reset and kept for the next connection, with its CQ.
			t.cqKept = true
		} else {
			err := t.qp.Close()
			qpGone = err == nil
			errs = append(errs, err)
		}
	}
	if t.inAsync {
		// Only now: a CQ_ERR read while putQP kept the pair must find
		// t to mark, or the pair in the cache (cqErrLocked).
		t.dev.removeConn(t)
		t.inAsync = false
	}
	if t.hasMem && qpGone {
		// The device no longer touches the buffers: another connection
		// may have them. (Were the QP still there, they stay out of the
		// pool.)
		errs = append(errs, t.dev.pool.put(t.mem))
		t.hasMem = false
	}
	if t.cq != nil && !t.cqKept {
		errs = append(errs, t.cq.Close())
	}
	if t.dev != nil {
		t.dev.release()
	}
	if t.id != nil {
		errs = append(errs, t.id.Close())
	}
	if t.ch != nil {
		errs = append(errs, t.ch.release())
	}
	return errors.Join(errs...)
}
