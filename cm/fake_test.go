package cm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeWire joins two fake transports like a reliable connection with RNR
// retries turned off: a send that finds no posted receive buffer fails, so a
// flow-control bug shows up as an error instead of a slow retry.
type fakeWire struct {
	mu      sync.Mutex
	ends    [2]*fakeEnd
	rnr     int
	regions map[uint32][]byte
	access  map[uint32]Access // what the peer may do with each region
	nextKey uint32
}

type fakeEnd struct {
	w           *fakeWire
	side        int
	sendBufs    [][]byte
	recvBufs    [][]byte
	posted      []int // receive slots, in post order
	cq          []completion
	notify      chan struct{}
	shut        bool
	released    bool
	interrupted bool                    // interrupt's wake-up not yet taken by a poll
	corrupt     func(imm uint32) uint32 // tampers with the next frame header this end sends
	pollErr     error                   // the next blocking poll fails with it, once
	postFails   bool
	// posting, if set, runs once as postSend is called, before it posts
	// (the Conn's locks held as for a post).
	posting func()
	// recvPostFails: postRecvs fails (as ibv_post_recv may), posting
	// nothing.
	recvPostFails bool
	sends         int // sends posted
	signaled      int // of them signaled (or failed), so completing
	recvPosts     int // postRecvs calls
	spins         int // polls asked to busy-poll
	blocks        int // polls asked to sleep until a completion
	// Send slots posted and not yet covered by a completion the Conn has
	// polled, in post order: reusing one of them would overwrite a buffer
	// the device may still read.
	busy   []int
	reused int
	// onPeerGone is the Conn's, as the CM watcher calls it on a
	// DISCONNECTED event; release calls the peer's.
	onPeerGone func(reason string)
	// tookCompletions, if set, runs once as a poll returns completions,
	// between the poll and the round's handling of them.
	tookCompletions func()
	// releasedVanished: release was told the peer vanished.
	releasedVanished bool
	releaseErr       error  // what release returns
	probeKey         uint32 // the key of this end's probe target (a fake region)
	probes           int    // keepalive probes posted
	// One-sided operations and probes posted whose completion the Conn
	// has not polled: with busy, what the send queue holds, which must
	// never pass its size (sendSlots+2, as rdmaTransport makes it).
	rdmaOut, probeOut int
	sqOverflow        int
	holdProbes        bool         // probes complete only when flushed (a peer slow to answer)
	heldProbes        []completion // their completions, meanwhile
	// maxMsg is the device's largest message (its port's max_msg_sz; 0:
	// none): a longer one-sided request fails, local length error, and
	// its QP goes to the error state, as on a device.
	maxMsg int
	// Requests posted while the peer's QP is in the error state (it drops
	// every packet) and ours is not: the device retries them, so they
	// complete only when our QP is flushed (our CM reports the peer's
	// disconnect: peerGone) or, with no disconnect (a vanished peer), when
	// the retries run out (retryTimer, fakeRetryTime).
	retrying   []completion
	retryTimer *time.Timer
}

// fakeRetryTime is how long the fake retries a request to a peer whose QP
// is in the error state before it fails with "transport retries exceeded"
// (a device retries for about a second). It is far longer than the gap
// between a Conn's release shutting its QP and the fake's release telling
// the peer, so a request that the peer's graceful close caught in that gap
// is flushed with the disconnect known, as on a device. It failed at once:
// the peer took the flush, before its CM's word, for a failure (a graceful
// close counted in Stats.Errors now and then under load in
// TestCloseDuringBlockedCloseWriteSendsFin).
const fakeRetryTime = 200 * time.Millisecond

var errFakeRetries = errors.New("fake: transport retries exceeded")

// retryLocked holds c, a request to a peer in the error state, until our
// QP is flushed or the retries run out (one timer for all those held: a
// request posted later may fail sooner, which does not matter here); w.mu
// is held.
func (e *fakeEnd) retryLocked(c completion) {
	e.retrying = append(e.retrying, c)
	if e.retryTimer == nil {
		e.retryTimer = time.AfterFunc(fakeRetryTime, e.retriesExceeded)
	}
}

// retriesExceeded fails the requests still retried: no disconnect came.
func (e *fakeEnd) retriesExceeded() {
	e.w.mu.Lock()
	defer e.w.mu.Unlock()
	e.retryTimer = nil
	if len(e.retrying) == 0 {
		return
	}
	for _, c := range e.retrying {
		c.err = errFakeRetries
		e.cq = append(e.cq, c)
	}
	e.retrying = nil
	e.signal()
}

// sqCheck counts a post that takes the send queue past its size; w.mu is
// held.
func (e *fakeEnd) sqCheck() {
	if len(e.busy)+e.rdmaOut+e.probeOut > len(e.sendBufs)+2 {
		e.sqOverflow++
	}
}

func newFakeWire(sendSlots, recvSlots [2]int, size [2]int) *fakeWire {
	w := &fakeWire{regions: map[uint32][]byte{}, access: map[uint32]Access{}, nextKey: 100}
	for i := range w.ends {
		e := &fakeEnd{w: w, side: i, notify: make(chan struct{}, 1)}
		w.nextKey++
		e.probeKey = w.nextKey
		w.regions[e.probeKey] = make([]byte, probeLen)
		w.access[e.probeKey] = RemoteRead
		for s := 0; s < sendSlots[i]; s++ {
			e.sendBufs = append(e.sendBufs, make([]byte, size[i]))
		}
		for s := 0; s < recvSlots[i]; s++ {
			e.recvBufs = append(e.recvBufs, make([]byte, size[1-i]))
		}
		w.ends[i] = e
	}
	return w
}

func (e *fakeEnd) peer() *fakeEnd { return e.w.ends[1-e.side] }

func (e *fakeEnd) signal() {
	select {
	case e.notify <- struct{}{}:
	default:
	}
}

func (e *fakeEnd) sendBuf(slot int) []byte { return e.sendBufs[slot] }
func (e *fakeEnd) recvBuf(slot int) []byte { return e.recvBufs[slot] }

var errFakeFlushed = errors.New("fake: work request flushed")
var errFakeRNR = errors.New("fake: receiver not ready")
var errFakeLocLen = errors.New("fake: local length error")

func (e *fakeEnd) postSend(slot, n int, imm uint32, hasImm, signaled bool) error {
	e.w.mu.Lock()
	if f := e.posting; f != nil {
		e.posting = nil
		e.w.mu.Unlock()
		f()
		e.w.mu.Lock()
	}
	defer e.w.mu.Unlock()
	if e.postFails {
		return errors.New("fake: post refused")
	}
	if e.corrupt != nil {
		imm = e.corrupt(imm)
		e.corrupt = nil
	}
	p := e.peer()
	var err error
	retried := false
	switch {
	case e.shut:
		// A QP in the error state takes the request and flushes it, as
		// the IB spec has it.
		err = errFakeFlushed
	case p.shut:
		// The peer's QP drops the packets: the device retries (see
		// retrying).
		retried = true
	case len(p.posted) == 0:
		e.w.rnr++
		err = errFakeRNR
	default:
		r := p.posted[0]
		p.posted = append(p.posted[:0], p.posted[1:]...)
		copy(p.recvBufs[r], e.sendBufs[slot][:n])
		p.cq = append(p.cq, completion{op: compRecv, slot: r, n: n, imm: imm, hasImm: hasImm})
		p.signal()
	}
	for _, b := range e.busy {
		if b == slot {
			e.reused++
		}
	}
	e.busy = append(e.busy, slot)
	e.sqCheck()
	e.sends++
	if retried { // it will fail, so it completes even unsignaled
		e.signaled++
		e.retryLocked(completion{op: compSend, slot: slot})
		return nil
	}
	if signaled || err != nil { // a failed send completes even unsignaled
		e.signaled++
		e.cq = append(e.cq, completion{op: compSend, slot: slot, err: err})
		e.signal()
	}
	return nil
}

func (e *fakeEnd) postRecvs(slots []int) error {
	e.w.mu.Lock()
	defer e.w.mu.Unlock()
	e.recvPosts++
	if e.recvPostFails {
		return errors.New("fake: receive post refused")
	}
	if e.shut {
		// In the error state a receive completes at once, flushed.
		for _, r := range slots {
			e.cq = append(e.cq, completion{op: compRecv, slot: r, err: errFakeFlushed})
		}
		e.signal()
		return nil
	}
	e.posted = append(e.posted, slots...)
	return nil
}

type fakeMem struct {
	w   *fakeWire
	key uint32
	b   []byte
	// closed: deregistered. The device's MR gives no memory, address or
	// key after Close (verbs.MR, whose memory Close unmaps): nor does this.
	closed atomic.Bool
}

func (m *fakeMem) bytes() []byte {
	if m.closed.Load() {
		return nil
	}
	return m.b
}

func (m *fakeMem) addr() uint64 {
	if m.closed.Load() {
		return 0
	}
	return 0x1000
}

func (m *fakeMem) rkey() uint32 {
	if m.closed.Load() {
		return 0
	}
	return m.key
}

func (m *fakeMem) close() error {
	m.w.mu.Lock()
	delete(m.w.regions, m.key)
	delete(m.w.access, m.key)
	m.w.mu.Unlock()
	m.closed.Store(true)
	return nil
}

func (e *fakeEnd) regMem(size int, access Access) (memory, error) {
	e.w.mu.Lock()
	defer e.w.mu.Unlock()
	e.w.nextKey++
	m := &fakeMem{w: e.w, key: e.w.nextKey, b: make([]byte, size)}
	e.w.regions[m.key] = m.b
	e.w.access[m.key] = access
	return m, nil
}

func (e *fakeEnd) postRDMA(write bool, local *Region, off, n int, remote RemoteRegion, roff uint64) error {
	e.w.mu.Lock()
	defer e.w.mu.Unlock()
	if m, ok := local.mem.(*fakeMem); !ok || m.w != e.w {
		// Another wire is another device, as rdmaTransport refuses it.
		return notPostedError{fmt.Errorf("fake: region of another device: %w", ErrInvalid)}
	}
	rb, ok := e.w.regions[remote.RKey]
	var err error
	need := RemoteRead
	if write {
		need = RemoteWrite
	}
	ro := roff + remote.Addr - 0x1000 // in the region, where the checks pass
	retried := false
	switch {
	case e.shut:
		// A QP in the error state flushes the request, as postSend
		// does: nothing reaches the peer.
		err = errFakeFlushed
	case e.maxMsg > 0 && n > e.maxMsg:
		err = errFakeLocLen
	case e.peer().shut:
		// The peer's QP drops the packets, key checks and all: the
		// device retries (see retrying), and the peer's memory is
		// not touched.
		retried = true
	case !ok || e.w.access[remote.RKey]&need == 0 || remote.Addr < 0x1000 || ro > uint64(len(rb)) || uint64(n) > uint64(len(rb))-ro:
		// The device checks the key, its grant and the registered range
		// (a descriptor's Len is the peer's word).
		err = errors.New("fake: remote access error")
		// An RC responder's access violation is a class C error: its
		// QP goes to the error state too (rxe_qp_error).
		e.peer().shutdownLocked()
	default:
		if write {
			copy(rb[ro:ro+uint64(n)], local.Bytes()[off:off+n])
		} else {
			copy(local.Bytes()[off:off+n], rb[ro:ro+uint64(n)])
		}
	}
	e.rdmaOut++
	e.sqCheck()
	if retried {
		e.retryLocked(completion{op: compRDMA})
		return nil
	}
	e.cq = append(e.cq, completion{op: compRDMA, err: err})
	if err == errFakeLocLen {
		e.shutdownLocked()
	}
	e.signal()
	return nil
}

func (e *fakeEnd) maxMessage() int {
	e.w.mu.Lock()
	defer e.w.mu.Unlock()
	return e.maxMsg
}

func (e *fakeEnd) probeTarget() probeTarget { return probeTarget{addr: 0x1000, rkey: e.probeKey} }

// postProbe reads the peer's probe target, as the device does without the
// peer's application; a peer whose node is gone (shut) answers nothing.
func (e *fakeEnd) postProbe(peer probeTarget) error {
	e.w.mu.Lock()
	defer e.w.mu.Unlock()
	var err error
	retried := false
	switch p := e.peer(); {
	case e.shut:
		err = errFakeFlushed
	case p.shut:
		retried = true // its node answers nothing: see retrying
	case peer.rkey != p.probeKey || peer.addr != 0x1000:
		err = errors.New("fake: remote access error")
	}
	e.probes++
	e.probeOut++
	e.sqCheck()
	if retried {
		e.retryLocked(completion{op: compProbe})
		return nil
	}
	if e.holdProbes && err == nil {
		e.heldProbes = append(e.heldProbes, completion{op: compProbe})
		return nil
	}
	e.cq = append(e.cq, completion{op: compProbe, err: err})
	e.signal()
	return nil
}

// wokeIdle takes a wake-up in: it reports whether it came after a
// shutdown or an interrupt with nothing to complete.
func (e *fakeEnd) wokeIdle() bool {
	e.w.mu.Lock()
	defer e.w.mu.Unlock()
	idle := (e.shut || e.interrupted) && len(e.cq) == 0
	e.interrupted = false
	return idle
}

func (e *fakeEnd) poll(ctx context.Context, cs []completion, spin time.Duration, block bool) (int, error) {
	e.w.mu.Lock()
	if spin > 0 {
		e.spins++
	}
	if block {
		e.blocks++
	}
	e.w.mu.Unlock()
	for {
		e.w.mu.Lock()
		n := copy(cs, e.cq)
		e.cq = append(e.cq[:0], e.cq[n:]...)
		for _, c := range cs[:n] {
			switch c.op {
			case compRDMA:
				e.rdmaOut--
			case compProbe:
				e.probeOut--
			}
			if c.op != compSend {
				continue
			}
			// In order: this completion covers every send posted before.
			for i, b := range e.busy {
				if b == c.slot {
					e.busy = append(e.busy[:0], e.busy[i+1:]...)
					break
				}
			}
		}
		took := e.tookCompletions
		if n > 0 {
			e.tookCompletions = nil
		}
		e.w.mu.Unlock()
		if n > 0 && took != nil {
			took()
		}
		if n > 0 || !block {
			return n, nil
		}
		e.w.mu.Lock()
		perr := e.pollErr
		e.pollErr = nil
		e.w.mu.Unlock()
		if perr != nil {
			return 0, perr
		}
		select {
		case <-e.notify:
			// Like rdmaTransport.wait: a wake-up after shutdown with
			// nothing to complete returns, so the caller rechecks.
			if e.wokeIdle() {
				return 0, nil
			}
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

func (e *fakeEnd) interrupt() {
	e.w.mu.Lock()
	defer e.w.mu.Unlock()
	if !e.released {
		e.interrupted = true
		e.signal()
	}
}

func (e *fakeEnd) shutdown() {
	e.w.mu.Lock()
	defer e.w.mu.Unlock()
	e.shutdownLocked()
}

func (e *fakeEnd) shutdownLocked() {
	if e.shut {
		return
	}
	e.shut = true
	for _, r := range e.posted {
		e.cq = append(e.cq, completion{op: compRecv, slot: r, err: errFakeFlushed})
	}
	e.posted = nil
	for range e.heldProbes {
		e.cq = append(e.cq, completion{op: compProbe, err: errFakeFlushed})
	}
	e.heldProbes = nil
	for _, c := range e.retrying {
		c.err = errFakeFlushed
		e.cq = append(e.cq, c)
	}
	e.retrying = nil
	if e.retryTimer != nil {
		e.retryTimer.Stop()
		e.retryTimer = nil
	}
	e.signal()
}

func (e *fakeEnd) release(ctx context.Context, vanished bool) error {
	e.shutdown()
	e.w.mu.Lock()
	first := !e.released
	e.released = true
	e.releasedVanished = vanished
	gone := e.peer().onPeerGone
	err := e.releaseErr
	e.w.mu.Unlock()
	// The peer's CM sees a disconnect.
	if first && gone != nil {
		gone("peer disconnected")
	}
	return err
}

type fakeAddr string

func (a fakeAddr) Network() string { return "rdma" }
func (a fakeAddr) String() string  { return string(a) }

type fakeOpts struct {
	depth     [2]int
	msgSize   [2]int
	raw       bool
	keepalive time.Duration
	busyPoll  time.Duration
	// holdProbes: keepalive probes complete only when flushed (a peer
	// slow to answer reads).
	holdProbes bool
	timeout    time.Duration // the handshake timeout; 0: 2 s
	maxMsg     int           // the devices' largest message (fakeEnd.maxMsg)
}

// fakePair returns two connected Conns over a fakeWire, as Dial and Accept
// would after the handshake.
func fakePair(t testing.TB, o fakeOpts) (*Conn, *Conn, *fakeWire) {
	t.Helper()
	checkGoroutines(t)
	for i := range o.depth {
		if o.depth[i] == 0 {
			o.depth[i] = 8
		}
		if o.msgSize[i] == 0 {
			o.msgSize[i] = 256
		}
	}
	if o.timeout == 0 {
		o.timeout = 2 * time.Second
	}
	hdr := userImmLen
	if o.raw {
		hdr = 0
	}
	// Sized as Dial (side 0) and Accept (side 1) size them: each side
	// posts depth+1 receives (one for credit returns); the dialer has as
	// many send slots, the acceptor no more than the dialer has receives,
	// and each may have the smaller depth plus one frames in flight to the
	// other (agree).
	recvSlots := [2]int{o.depth[0] + 1, o.depth[1] + 1}
	sendSlots := [2]int{recvSlots[0], min(recvSlots[0], recvSlots[1])}
	window := [2]int{min(recvSlots[0], recvSlots[1]), min(recvSlots[0], recvSlots[1])}
	if o.raw {
		recvSlots = [2]int{o.depth[0], o.depth[1]}
		sendSlots, window = recvSlots, [2]int{recvSlots[1], recvSlots[0]}
	}
	maxSend := [2]int{min(o.msgSize[0], o.msgSize[1]), min(o.msgSize[0], o.msgSize[1])}
	w := newFakeWire(sendSlots, recvSlots, [2]int{maxSend[0] + hdr, maxSend[1] + hdr})
	for _, e := range w.ends {
		e.holdProbes = o.holdProbes
		e.maxMsg = o.maxMsg
	}
	var conns [2]*Conn
	for i := range conns {
		c, err := newConn(w.ends[i], fakeAddr(fmt.Sprintf("side%d", i)), fakeAddr(fmt.Sprintf("side%d", 1-i)), connParams{
			raw: o.raw, sendSlots: sendSlots[i], recvSlots: recvSlots[i], peerSlots: window[i],
			maxSend: maxSend[i], maxRecv: maxSend[1-i], timeout: o.timeout, keepalive: o.keepalive,
			busyPoll: o.busyPoll,
		})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.postAllRecvs(); err != nil {
			t.Fatal(err)
		}
		if !o.raw {
			c.peerProbe = w.ends[1-i].probeTarget() // from the peer's hello
		}
		globalStats.connsOpen.Add(1)
		c.startKeepalive()
		w.mu.Lock()
		w.ends[i].onPeerGone = c.peerGone
		w.mu.Unlock()
		conns[i] = c
	}
	t.Cleanup(func() {
		conns[0].Close()
		conns[1].Close()
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.rnr != 0 {
			t.Errorf("%d sends found no receive buffer: flow control failed", w.rnr)
		}
		for _, e := range w.ends {
			if e.reused != 0 {
				t.Errorf("side %d: %d sends reused a slot whose send had not completed", e.side, e.reused)
			}
			if e.sqOverflow != 0 {
				t.Errorf("side %d: %d posts took the send queue past its size", e.side, e.sqOverflow)
			}
		}
	})
	return conns[0], conns[1], w
}

var _ net.Addr = fakeAddr("")

// polls returns how many of side's polls were asked to busy-poll and how
// many to sleep.
func (w *fakeWire) polls(side int) (spins, blocks int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ends[side].spins, w.ends[side].blocks
}
