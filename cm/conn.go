package cm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/goxrc/goxrc/internal/ring"
	"github.com/goxrc/goxrc/internal/turn"
	"github.com/goxrc/goxrc/verbs"
	"github.com/goxrc/goxrc/xrc"
)

// DefaultBusyPoll is how long a waiting call polls the completion queue
// before it arms the CQ and sleeps until the device's completion channel,
// read by one goroutine in the netpoller, reports an event for it.
// Spinning for about a round trip keeps ping-pong latency near a
// busy-polling C program's (a wake-up through the netpoller costs tens of
// microseconds, more under emulation); sleeping after it keeps idle
// connections free. A connection starts spinning after its first
// completion: its first wait sleeps at once. WithBusyPoll changes it.
const DefaultBusyPoll = 200 * time.Microsecond

// maxSpinStretch and maxStretchedSpin bound how far a connection stretches
// its busy-poll window past the configured one (see Conn.spinFor): to 8
// windows, at most 2 ms, about what one sleeping wait's wake-up costs under
// emulation; spinning longer than a wake-up to avoid one does not pay.
// maxLateCatches is how many late catches in a row stop the stretching.
const (
	maxSpinStretch   = 8
	maxStretchedSpin = 2 * time.Millisecond
	maxLateCatches   = 4
)

// spinSlice bounds one C call of a busy poll (verbs.CQ.PollSpin): polling
// inside C saves a cgo transition per poll, and between slices the loop
// checks ctx. It stays under the runtime monitor's 20 us tick: a cgo call
// seen on two ticks counts as blocked, and with other goroutines runnable
// the runtime would start another thread for them, so that many spinning
// connections could spin on as many threads at once.
const spinSlice = 10 * time.Microsecond

// spinYield is how often a busy connection yields its thread. The runtime
// forces a reschedule on a goroutine that kept its scheduling tick for
// 10 ms; a goroutine that only polls, posts and copies (cgo calls, no
// blocking) is never rescheduled otherwise, so its tick never moves, and
// the runtime's monitor then takes its P away during a post on every one of
// its 20 us wake-ups, each a thread wake-up. Measured in the VM: one
// monitor wake-up per message, a core's worth of CPU. Yielding moves the
// tick and lets the monitor sleep.
const spinYield = 4 * time.Millisecond

// minPersist and maxPersist bound the persist timer's delay (see
// Conn.persist): it starts at about a sleeping wake-up under emulation and
// doubles while no data comes, so a pair of peers that are both stuck
// (each sending, neither reading) exchange a frame now and then rather
// than spin.
const (
	minPersist = 200 * time.Microsecond
	maxPersist = 20 * time.Millisecond
)

// maxYieldCheckEvery bounds yieldPacer's interval: a clock read costs more
// than the rest of a fast send's bookkeeping.
const maxYieldCheckEvery = 32

// yieldPacer paces the clock reads by which a path that does not spin
// (sends that always find credits, progress rounds that always find
// completions) notices a due yield. It reads the clock every `every`
// operations and adapts `every` to what an operation costs, so that reads
// come between spinYield/8 and spinYield/4 apart. A fixed count fails one
// way or the other: under emulation a 64 KiB post takes milliseconds, so 32
// of them outlast the runtime's 10 ms (see spinYield), while a clock read on
// every 64 B send was a sixth of the send path on the host.
type yieldPacer struct {
	every, n int
	last     time.Duration // since epoch, at the last read
}

// tick counts one operation and, when a read is due, yields if c is due.
func (p *yieldPacer) tick(c *Conn) {
	if p.n++; p.n < p.every {
		return
	}
	p.n = 0
	now := time.Now()
	t := now.Sub(epoch)
	switch gap := t - p.last; {
	case gap > spinYield/4:
		p.every /= 2
	case gap < spinYield/8:
		p.every *= 2
	}
	p.every = min(max(p.every, 1), maxYieldCheckEvery)
	p.last = t
	c.yieldIfDue(now)
}

// Conn is an established RDMA connection carrying messages. Send and Recv
// may be called from different goroutines at once; each serialises its own
// callers. Dial and Accept make Conns; a nil or zero Conn is a closed one.
type Conn struct {
	t            transport
	x            *xrc.Conn // an XRC connection (WithFabric) instead of t
	xrelease     func()
	xclosed      atomic.Bool // Close was called on x (see closedXRCErr)
	laddr, raddr net.Addr
	raw          bool
	log          logFunc // warnings
	logInfo      logFunc

	maxSend     int // largest payload this side may send (the peer's limit)
	maxRecv     int // largest payload this side accepts
	peerSlots   int // receive buffers the peer posts: the credit ceiling
	recvSlots   int
	timeout     time.Duration
	busyPoll    time.Duration
	keepalive   time.Duration
	peerProbe   probeTarget   // what keepalive probes read (the peer's hello)
	probing     bool          // a probe is out, its completion not handled; under mu
	posts       uint64        // frames posted, for the keepalive's idle check; under mu
	lastYield   atomic.Int64  // monotonic nanoseconds of the last yield (spinYield)
	kaStop      chan struct{} // closed by Close: ends the keepalive loop
	releaseOnce sync.Once
	releaseErr  error
	graceful    chan struct{} // closed when the first Close has sent its FIN and drained
	finBusy     chan struct{} // closed when the call posting our FIN has posted it or given up; under mu
	freed       chan struct{} // closed when release has freed the transport (the QP is gone or reset)

	sendTurn turn.Turn  // serialises senders
	sendPace yieldPacer // sends' yield checks; guarded by sendTurn
	pollPace yieldPacer // progress rounds', likewise; the polling leader's
	// spinNext says whether progress rounds busy-poll: not until the first
	// completion (the polling leader's). A fresh connection's first wait
	// (a server's for the first request) sleeps at once: under a burst of
	// new connections, each one spinning for a window would burn the CPU
	// that the handshakes need. Deciding by how long waits took instead
	// failed: a wait that sleeps takes longer than the window under
	// emulation by the wake-up alone, so spinning, once off, stayed off.
	spinNext bool
	// spinFor is the busy-poll window of the next wait (the polling
	// leader's): busyPoll, stretched after a wait that slept yet ended
	// soon after the window. Two peers in ping-pong whose replies come just
	// after the window would otherwise both sleep on every message for
	// good: each one's wake-up makes the other's wait outlast its window.
	// It shrinks back as soon as a message comes within busyPoll again.
	// lateCatches counts the waits since then that a stretched window
	// caught after busyPoll; at maxLateCatches the peer is taken for simply
	// slow (a client with think time, a periodic sender), not locked with us
	// in sleeping, and stretching stops (noStretch) until a message comes
	// within busyPoll: spinning through every gap of such a peer would burn
	// a core.
	spinFor     time.Duration
	lateCatches int
	noStretch   bool
	recvTurn    turn.Turn  // serialises receivers
	postMu      sync.Mutex // orders sequence numbers with posts
	rdmaTurn    turn.Turn  // one one-sided operation at a time
	repostMu    sync.Mutex // one batch of receive reposts at a time; owns flushBuf
	flushBuf    []int

	sigEvery  int // a send is signaled at least once in this many (see postFrame)
	recvBatch int // receive buffers are reposted in chains of this many (see recycle)

	ioMu     sync.RWMutex // see io
	released bool

	// creditsDue mirrors part of returnCredits' condition (see
	// creditsDueLocked) so that the data path, which asks
	// after every message, takes no lock when nothing is due. It is set
	// under mu wherever those change; whoever sets it calls returnCredits.
	creditsDue atomic.Bool

	// wroteEnd: a CloseWrite returned nil. Later ones do too, whatever
	// came since (the peer's end or death, a device loss), until our
	// Close: the half-close happened. RC said nil or ErrPeerGone by
	// whether it had taken the peer's disconnect in yet, XRC ErrPeerGone.
	wroteEnd atomic.Bool

	mu      sync.Mutex // guards the fields below
	credits int
	pending int // receive buffers reposted, not yet returned to the peer
	// ctrlPending counts the buffers among pending that held control
	// frames, and deferredCtrl those among deferred (see persist).
	ctrlPending  int
	deferredCtrl int
	// peerStarved: the peer's last frame left it short of credit for
	// data, and no credits went back since. peerShort: its last frame
	// did, whatever went back since (see persist).
	peerStarved  bool
	peerShort    bool
	persistTimer *time.Timer
	persistArmed bool
	persistDelay time.Duration
	// The reaper (see reap): armed by a data post, it runs a round that
	// does not wait when no caller does.
	reapTimer   *time.Timer
	reapArmed   bool
	reapDelay   time.Duration
	sendSeq     uint16
	recvSeq     uint16
	freeSend    []int
	inFlight    ring.Ring[int] // send slots posted and not yet completed, in post order
	unsignaled  int            // sends posted since the last signaled one
	ready       ring.Ring[readyMsg]
	polling     bool
	waiting     waitList      // goroutines waiting for the leader's round to end
	rounds      atomic.Uint64 // progress rounds ended (see progress); changed under mu
	err         error         // sticky: the connection is broken
	broke       bool          // err is a failure (counted in Stats.Errors), not an orderly end
	peerFin     bool
	peerLeft    string // why the peer went, once the CM said so
	closing     bool
	lostClose   bool // closing is deviceLost's, not the application's Close
	devLost     bool // deviceLost ran: the release waits for no time-wait
	joining     bool // start has not handed it out: a loss meanwhile drops it; failures wait for start to be logged
	writeClosed bool // CloseWrite: no more data frames
	finPosted   bool // our FIN is posted (by CloseWrite or Close), once
	rdmaDone    bool
	rdmaErr     error
	rdmaOut     bool // a one-sided request is (being) posted, its completion not handled
	rdmaWaiting bool // a one-sided operation's caller has not returned yet
	releasing   bool // release has begun: no progress round starts any more
	cqBroken    bool // a poll of the CQ failed: no completion will come any more
	cbuf        []completion
	deferred    []int // receive slots consumed, waiting to be reposted
	reposting   int   // of them, taken by flushRecvs and being posted
	// failLogs are the failures to log, written after mu is released
	// (failureLogsLocked, logFailures): the logger is the application's,
	// and its handler may call the Conn (Stats takes mu).
	failLogs []error

	stats connStats
}

type logFunc func(msg string, args ...any)

type readyMsg struct {
	slot   int
	off, n int
	imm    uint32
	hasImm bool
	// kept is the message's copy, out of the receive buffer that went
	// with the device (keepReadyLocked); nil while it is in the buffer.
	kept []byte
}

type connParams struct {
	raw       bool
	sendSlots int
	recvSlots int
	peerSlots int // peer's posted receives (framed mode)
	maxSend   int
	maxRecv   int
	timeout   time.Duration
	busyPoll  time.Duration
	keepalive time.Duration
	log       logFunc // warnings
	logInfo   logFunc
}

// newConn wires the engine to a transport whose receive buffers are not yet
// posted; it posts them all.
func newConn(t transport, laddr, raddr net.Addr, p connParams) (*Conn, error) {
	c := &Conn{
		t: t, laddr: laddr, raddr: raddr, raw: p.raw, log: p.log, logInfo: p.logInfo,
		maxSend: p.maxSend, maxRecv: p.maxRecv, peerSlots: p.peerSlots,
		recvSlots: p.recvSlots, timeout: p.timeout, busyPoll: p.busyPoll, keepalive: p.keepalive,
		credits:   p.peerSlots,
		freeSend:  make([]int, 0, p.sendSlots),
		ready:     ring.Make[readyMsg](p.recvSlots),
		cbuf:      make([]completion, p.sendSlots+p.recvSlots+1),
		inFlight:  ring.Make[int](p.sendSlots),
		deferred:  make([]int, 0, p.recvSlots),
		flushBuf:  make([]int, 0, p.recvSlots),
		sigEvery:  sigInterval(p.sendSlots, p.raw),
		recvBatch: repostBatch(min(p.recvSlots, p.peerSlots)),
		graceful:  make(chan struct{}),
		freed:     make(chan struct{}),
		sendTurn:  turn.New(),
		recvTurn:  turn.New(),
		rdmaTurn:  turn.New(),
	}
	c.lastYield.Store(int64(time.Since(epoch))) // a new connection has nothing to yield for yet
	if c.log == nil {
		c.log = func(string, ...any) {}
	}
	if c.logInfo == nil {
		c.logInfo = func(string, ...any) {}
	}
	if p.raw {
		// A raw peer has no credits to say what is posted: it counts on
		// each buffer going back once read, as plain librdmacm programs
		// repost theirs, and a chain held back met it with no receive.
		c.recvBatch = 1
	}
	for i := p.sendSlots - 1; i >= 0; i-- {
		c.freeSend = append(c.freeSend, i)
	}
	return c, nil
}

func (c *Conn) postAllRecvs() error {
	slots := c.flushBuf[:0]
	for i := 0; i < c.recvSlots; i++ {
		slots = append(slots, i)
	}
	return c.t.postRecvs(slots)
}

// sigInterval is how many sends share one signaled completion. A signaled
// send's completion frees every slot posted before it (an RC queue pair
// completes in order), so fewer completions are polled and handled. A send
// that takes the last free slot is always signaled, so a sender out of slots
// always has a completion to wait for. Raw connections signal every send:
// without a closing frame, nothing would complete the last unsignaled ones.
func sigInterval(sendSlots int, raw bool) int {
	if raw {
		return 1
	}
	return max(1, sendSlots/4)
}

// repostBatch is how many consumed receive buffers are reposted in one
// chain. It stays well below the credit return threshold (half the peer's
// window); a starved peer gets its buffers back at once (recycle).
func repostBatch(window int) int {
	return max(1, window/4)
}

// ok reports whether c was made by Dial or Accept: a nil or zero Conn has
// no transport, and its methods act as a closed Conn's.
func (c *Conn) ok() bool { return c != nil && (c.t != nil || c.x != nil) }

// LocalAddr returns the local address (nil for a nil Conn, as the getters
// below give their zero values: a nil Conn is a closed one, as for Close,
// Send and Recv).
func (c *Conn) LocalAddr() net.Addr {
	if !c.ok() {
		return nil
	}
	return c.laddr
}

// Transport says what carries the connection: TransportXRC where an XRC
// mode found XRC (or over WithFabric), TransportRC otherwise, so a program
// that asked for XRCPrefer learns which it got, and whether immediate data
// and one-sided RDMA are there.
func (c *Conn) Transport() Transport {
	if !c.ok() {
		return 0
	}
	if c.x != nil {
		return TransportXRC
	}
	return TransportRC
}

// RemoteAddr returns the peer's address.
func (c *Conn) RemoteAddr() net.Addr {
	if !c.ok() {
		return nil
	}
	return c.raddr
}

// MaxMessageSize is the largest payload Send accepts on this connection: the
// smaller of this side's and the peer's limits. Size Recv buffers with
// MaxRecvSize: over XRC the two sides' limits need not agree.
func (c *Conn) MaxMessageSize() int {
	if !c.ok() {
		return 0
	}
	return c.maxSend
}

// MaxRecvSize is the largest message the peer may send on this connection,
// so a Recv buffer of this size always fits. On RC it is this side's
// WithMessageSize, as the device allows it (see WithMessageSize). Over XRC
// it is what the endpoint receives: this side's WithMessageSize, raised to the engine's least (xrc.MinMessageSize) and
// capped at its most (xrc.MaxMessageSize).
func (c *Conn) MaxRecvSize() int {
	if !c.ok() {
		return 0
	}
	return c.maxRecv
}

// Send sends p as one message. It blocks while the peer has no free receive
// buffer (flow control), honouring ctx. Send copies p, which the caller may
// reuse once it returns. A nil error means posted, not delivered: a failure
// after that is reported by a later call. A call that ctx ends leaves the
// connection usable, and sends nothing.
func (c *Conn) Send(ctx context.Context, p []byte) error {
	return c.send(ctx, p, 0, false)
}

// SendWithImm sends p with 32 bits of immediate data, which the receiver
// gets from RecvWithImm.
func (c *Conn) SendWithImm(ctx context.Context, p []byte, imm uint32) error {
	return c.send(ctx, p, imm, true)
}

func (c *Conn) send(ctx context.Context, p []byte, imm uint32, hasImm bool) error {
	if !c.ok() {
		return ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return c.opErr("send", err)
	}
	if len(p) > c.maxSend || hasImm && c.x != nil {
		// After Close or CloseWrite, ErrClosed (or, after Close, the
		// failure before it) comes first, as for a Send that could post
		// (their docs), not what the message would get from an open
		// connection.
		if err := c.sendClosedErr(); err != nil {
			return c.opErr("send", err)
		}
		if len(p) > c.maxSend {
			return c.opErr("send", fmt.Errorf("%w: %d bytes, limit %d", ErrMessageTooLong, len(p), c.maxSend))
		}
	}
	if c.x != nil {
		return c.sendXRC(ctx, p, hasImm)
	}
	if err := c.sendTurn.Take(ctx); err != nil {
		return c.opErr("send", err)
	}
	defer c.sendTurn.Give()
	c.sendPace.tick(c)
	for {
		// postFrame checks everything under its locks; without a free
		// slot and a credit (it keeps one back for credit returns, so two
		// sides that both ran out never wait on each other) it posts
		// nothing and the loop waits for completions.
		seen := c.rounds.Load()
		err := c.postFrame(frameData, p, imm, hasImm)
		if err == nil {
			break
		}
		if !errors.Is(err, errNoRoom) {
			return c.opErr("send", err)
		}
		if err := c.progress(ctx, seen); err != nil {
			return c.opErr("send", err)
		}
	}
	c.stats.msgsSent.Add(1)
	c.stats.bytesSent.Add(uint64(len(p)))
	c.returnCredits()
	return nil
}

// sendClosedErr is what a Send after the application's Close or CloseWrite
// returns: ErrClosed, or after Close the failure that broke c before; nil
// before either.
func (c *Conn) sendClosedErr() error {
	if c.x != nil {
		switch {
		case c.xclosed.Load():
			return mapXRCErr(c.closedXRCErr(xrc.ErrClosed))
		case c.wroteEnd.Load():
			return ErrClosed
		}
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closing && !c.lostClose || c.writeClosed {
		return c.postErrLocked(frameData)
	}
	return nil
}

// yieldIfDue yields the thread when this connection last did so more than
// spinYield ago (see spinYield): a sender that always finds credits, or a
// receiver that always finds messages, never blocks either.
func (c *Conn) yieldIfDue(now time.Time) {
	t := now.Sub(epoch)
	if last := time.Duration(c.lastYield.Load()); t-last > spinYield && c.lastYield.CompareAndSwap(int64(last), int64(t)) {
		runtime.Gosched()
	}
}

// postFrame takes a send slot and a credit (reserved by the caller's check),
// writes the header and payload, and posts. Callers have checked that a slot
// is free and the credit is there; postMu keeps sequence order equal to post
// order.
func (c *Conn) postFrame(kind frameKind, p []byte, imm uint32, hasImm bool) error {
	c.postMu.Lock()
	if !c.io() {
		// Released: by Close (c.err is ErrClosed), or on its own after
		// the device went (c.err says so).
		c.mu.Lock()
		err := c.postErrLocked(kind)
		c.mu.Unlock()
		c.postMu.Unlock()
		return err
	}
	// No defers: with this many returns the compiler cannot open-code
	// them, and the runtime's deferred calls cost a tenth of a message's
	// path (BenchmarkConnRoundTripFake).
	err := c.postFrameLocked(kind, p, imm, hasImm)
	c.ioDone()
	c.postMu.Unlock()
	return err
}

// postFrameLocked is postFrame's body; the caller holds postMu and io.
func (c *Conn) postFrameLocked(kind frameKind, p []byte, imm uint32, hasImm bool) error {
	c.mu.Lock()
	if c.err != nil || (kind == frameData && (c.closing || c.writeClosed)) {
		err := c.postErrLocked(kind)
		c.mu.Unlock()
		return err
	}
	need := 1
	if kind == frameData && !c.raw {
		need = 2
	}
	if len(c.freeSend) == 0 || (!c.raw && c.credits < need) || (kind == frameCredit && c.pending == 0) ||
		(kind == frameFin && c.credits == 1 && len(c.deferred)+c.reposting > 0) {
		// Another poster took what the caller saw (or, for a credit
		// return, already carried the credits). A FIN on our last
		// credit waits for the buffers we consumed to be reposted, and
		// carries them: the peer's last credit may have gone with the
		// frame one of them held, and with neither side left a credit
		// to return the other's, neither could send again.
		c.mu.Unlock()
		return errNoRoom
	}
	slot := c.freeSend[len(c.freeSend)-1]
	c.freeSend = c.freeSend[:len(c.freeSend)-1]
	c.inFlight.Push(slot)
	c.unsignaled++
	// Control frames are signaled: Close's drain waits for the FIN's.
	signaled := kind != frameData || c.unsignaled >= c.sigEvery || len(c.freeSend) == 0
	if signaled {
		c.unsignaled = 0
	}
	var h frameHeader
	if !c.raw {
		c.credits--
		h = frameHeader{kind: kind, credits: uint16(c.pending), seq: c.sendSeq}
		c.pending, c.ctrlPending = 0, 0
		c.peerStarved = false
		if c.creditsDue.Load() {
			// An atomic store is a locked instruction; most posts
			// find nothing due and skip it.
			c.creditsDue.Store(false)
		}
		c.sendSeq++
		if hasImm {
			h.flags |= flagImm
		}
		if c.credits < 2 {
			h.flags |= flagStarved
		}
		if kind == frameData {
			c.armReapLocked(minReap) // the peer answers data with credit frames
		}
	}
	// Counted under mu, not with an atomic add after it: one locked
	// instruction fewer per message.
	c.posts++
	c.mu.Unlock()

	buf := c.t.sendBuf(slot)
	n := len(p)
	if c.raw {
		copy(buf, p)
	} else {
		if hasImm {
			putUserImm(buf, imm)
			n += userImmLen
			buf = buf[userImmLen:]
		}
		copy(buf, p)
		imm, hasImm = h.imm(), true
	}
	if err := c.t.postSend(slot, n, imm, hasImm, signaled); err != nil {
		c.mu.Lock()
		c.inFlight.DropLast() // postMu is held: nothing was pushed after it
		c.freeSend = append(c.freeSend, slot)
		closing := c.closing
		c.mu.Unlock()
		if closing {
			// Our own Close shut the QP down under this post.
			return ErrClosed
		}
		err = fmt.Errorf("%w: post send: %w", ErrPeerGone, err)
		c.fail(err)
		return err
	}
	return nil
}

// postErrLocked is why a frame of kind cannot be posted on a connection
// that failed, closed or half-closed. After CloseWrite a data frame gets
// ErrClosed, also once the peer's end or a failure came (as CloseWrite's
// doc has it, and over XRC), and after a device loss, whose Close is cm's
// (lostClose), not the application's: that Close, which deviceLost starts
// in a goroutine, and the release after it made a Send say ErrPeerGone
// from a moment after the loss on, and ErrClosed before
// (TestCloseWriteThenDeviceLostSendSaysClosed).
func (c *Conn) postErrLocked(kind frameKind) error {
	err := c.closedErrLocked(c.err)
	if err == nil || kind == frameData && c.writeClosed && (!c.closing || c.lostClose) {
		err = ErrClosed
	}
	return err
}

var errNoRoom = errors.New("no send slot or credit")

// flushWait bounds how long release lets a one-sided request's caller wait
// for its flushed completion (it comes within microseconds of the QP's move
// to the error state) before it stops all rounds. A variable for tests,
// which stretch it so that a release nothing woke shows as a hang.
var flushWait = time.Second

// epoch makes lastYield monotonic.
var epoch = time.Now()

// startKeepalive probes the peer whenever nothing was posted for a
// keepalive interval. A probe is an RDMA read of the peer's probe target,
// which its device answers whatever its application does: a dead peer (a
// node gone without a disconnect) fails the read after the QP's retries,
// which breaks the connection and wakes every blocked call. Without probes
// an idle connection would not notice. One probe is out at a time: the next
// goes once the last one's completion has been handled.
func (c *Conn) startKeepalive() {
	if c.keepalive <= 0 || c.raw {
		return
	}
	c.kaStop = make(chan struct{})
	go func() {
		tick := time.NewTicker(c.keepalive)
		defer tick.Stop()
		seen := c.postCount()
		for {
			select {
			case <-c.kaStop:
				return
			case <-tick.C:
			}
			// Something was posted during the last interval: not idle.
			if n := c.postCount(); n != seen {
				seen = n
				continue
			}
			if c.probe() {
				c.stats.keepalives.Add(1)
			}
		}
	}()
}

// postCount is how many frames were posted (counted as they are, whether
// or not the post succeeds).
func (c *Conn) postCount() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.posts
}

// probe posts a keepalive probe unless the last one is still out or the
// connection has failed or been released. A Close under way still probes:
// waiting for a credit for its FIN, or for its sends to drain, it is a call
// blocked on the connection, and a peer whose node vanished is found only
// so (it waited out its whole bound for a credit that never came).
func (c *Conn) probe() bool {
	c.mu.Lock()
	ok := c.err == nil && !c.probing
	if ok {
		c.probing = true
	}
	c.mu.Unlock()
	if !ok || !c.io() {
		return false
	}
	err := c.t.postProbe(c.peerProbe)
	c.ioDone()
	if err != nil {
		c.mu.Lock()
		c.probing = false
		closing := c.closing
		c.mu.Unlock()
		if !closing { // else our own Close shut the QP down under it
			c.fail(fmt.Errorf("%w: post keepalive probe: %w", ErrPeerGone, err))
		}
		return false
	}
	return true
}

// returnCredits sends a credit frame when one is due (see
// creditsDueLocked). It waits at most for a post under
// way (posts do not block), then checks again: that post may have carried
// the credits. Skipping while another post held the lock lost credits when
// that post had read them before the repost (both sides then waited for
// each other: TestConnBidirectionalFloodNoDeadlock hung now and then).
func (c *Conn) returnCredits() {
	if c.raw || !c.creditsDue.Load() {
		return
	}
	c.mu.Lock()
	want := c.err == nil && c.creditsDueLocked() && c.credits >= 1 && len(c.freeSend) > 0
	c.mu.Unlock()
	if !want {
		return
	}
	// postFrame checks again under its locks: a frame posted meanwhile may
	// have carried the credits already.
	if err := c.postFrame(frameCredit, nil, 0, false); err == nil {
		c.stats.creditFrames.Add(1)
	}
}

// creditsDueLocked reports whether a credit frame is due at once: half
// the peer's window waits to be returned for messages the application
// consumed, or some does and the peer is starved. Buffers that held control
// frames do not count (see persist).
func (c *Conn) creditsDueLocked() bool {
	data := c.pending - c.ctrlPending
	return data > 0 && (data >= c.peerWindow()/2 || c.peerStarved)
}

// peerWindow is how many frames the peer may have in flight to us: our
// receive buffers, or fewer where its queue is shorter. Both sides take
// the smaller depth plus one in the handshake (agree), so it is also our
// credit ceiling, peerSlots. Credits and reposts go by it: a peer with a
// smaller window never has half our buffers in flight.
func (c *Conn) peerWindow() int { return min(c.recvSlots, c.peerSlots) }

// noteCreditsLocked updates creditsDue after what creditsDueLocked reads
// changed, and arms the persist timer when a peer that was short when it
// last sent is owed buffers that no rule returns at once.
func (c *Conn) noteCreditsLocked() {
	due := c.creditsDueLocked()
	if c.creditsDue.Load() != due { // set under mu only: no store is lost
		c.creditsDue.Store(due)
	}
	if !due {
		c.armPersistLocked()
	}
}

// armPersistLocked arms the persist timer if a peer that was short when it
// last sent is owed buffers: reposted ones, or consumed ones still queued
// for a repost chain (see recycle).
func (c *Conn) armPersistLocked() {
	if c.peerShort && c.pending+len(c.deferred) > 0 && !c.persistArmed && c.err == nil && !c.closing {
		c.persistArmed = true
		if c.persistTimer == nil {
			c.persistDelay = minPersist
			c.persistTimer = time.AfterFunc(c.persistDelay, c.persist)
		} else {
			c.persistTimer.Reset(c.persistDelay)
		}
	}
}

// persist returns buffers to a peer that was short of credit when it last
// sent, when no rule returns them at once: it is TCP's persist timer. Two
// kinds of buffers wait like that. Those of control frames: a credit frame
// consumes one of the peer's buffers in turn, and two peers that answered
// each other's control frames at once passed one credit back and forth
// for ever while neither had a message for the other (a receiver starved a
// sender that way at queue depth 2, the two trading credit frames while
// the data waited). And messages consumed below the threshold after a
// frame of ours went back, reposted or still short of a repost chain: one
// credit may leave the peer short still, but it does not say so again
// until it sends. Never returning either could leave a sender waiting for
// ever; so they go after a delay, which doubles until the peer sends data
// again.
func (c *Conn) persist() {
	c.mu.Lock()
	c.persistArmed = false
	due := c.err == nil && !c.closing && c.peerShort && c.pending+len(c.deferred) > 0
	if due {
		c.persistDelay = min(2*c.persistDelay, maxPersist)
	}
	queued := due && len(c.deferred) > 0
	c.mu.Unlock()
	if !due {
		return
	}
	if queued {
		// Consumed buffers short of a repost chain: post them, so that
		// the frame below returns them too.
		if !c.io() {
			return
		}
		err := c.flushRecvs()
		c.ioDone()
		if err != nil {
			return
		}
	}
	switch err := c.postFrame(frameCredit, nil, 0, false); {
	case err == nil:
		c.stats.creditFrames.Add(1)
	case errors.Is(err, errNoRoom):
		// No credit or send slot just now: try again later.
		c.mu.Lock()
		c.noteCreditsLocked()
		c.mu.Unlock()
	}
}

// Recv receives the next message into buf and returns its length. The
// message is copied into buf, which stays the caller's; MaxRecvSize bytes
// always fit. A buf too short for the message gives ErrMessageTooLong and
// leaves the message queued, as does a call that ctx ends. After the peer's
// graceful close (or CloseWrite), Recv returns io.EOF once every message
// before it is read, also where the device went away since. Messages taken
// in before the device went are still read after it, as over XRC, then
// io.EOF after the peer's end, else ErrPeerGone; Close drops them.
func (c *Conn) Recv(ctx context.Context, buf []byte) (int, error) {
	n, _, _, err := c.recv(ctx, buf)
	return n, err
}

// RecvWithImm is Recv that also returns the immediate data of a message sent
// with SendWithImm (ok reports whether it had any). Over XRC, where
// SendWithImm is not supported, it receives as Recv does, with ok false.
func (c *Conn) RecvWithImm(ctx context.Context, buf []byte) (n int, imm uint32, ok bool, err error) {
	return c.recv(ctx, buf)
}

func (c *Conn) recv(ctx context.Context, buf []byte) (int, uint32, bool, error) {
	if !c.ok() {
		return 0, 0, false, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return 0, 0, false, c.opErr("recv", err)
	}
	if c.x != nil {
		return c.recvXRC(ctx, buf)
	}
	if err := c.recvTurn.Take(ctx); err != nil {
		return 0, 0, false, c.opErr("recv", err)
	}
	defer c.recvTurn.Give()
	// io is taken before a message leaves the queue, so that its receive
	// buffer outlives the copy: a device loss between the two kept copies
	// of the others and gave this one's buffer back with the device
	// (TestDeviceLostDuringRecvLosesNothing). It is let go around waits.
	held := c.io()
	c.mu.Lock()
	for c.ready.Len() == 0 || c.closing && !c.lostClose {
		var err error
		switch {
		case c.closing:
			// Closed (by the application, or after a device loss): what
			// is left is not read. A failure that came before is the
			// answer; an orderly end (the peer's FIN) is not one. After
			// a device loss with the peer's FIN and every message read,
			// nothing was lost: io.EOF still, as over XRC and on a TCP
			// socket that had the FIN (TestDeviceLostAfterFinReadsEOF).
			if c.lostClose && c.peerFin && c.ready.Len() == 0 {
				err = io.EOF
			} else {
				err = c.closedErrLocked(c.err)
			}
		case c.peerFin:
			err = io.EOF
		case c.err != nil:
			err = c.err
		}
		if held {
			c.ioDone()
			held = false
		}
		if err != nil {
			c.mu.Unlock()
			if err == io.EOF {
				return 0, 0, false, err
			}
			return 0, 0, false, c.opErr("recv", err)
		}
		kept, err := c.progressLocked(ctx, true)
		if err != nil {
			return 0, 0, false, c.opErr("recv", err)
		}
		if held = kept; !kept {
			held = c.io()
			c.mu.Lock()
		}
	}
	m := c.ready.Peek()
	if m.n > len(buf) {
		c.mu.Unlock()
		if held {
			c.ioDone()
		}
		return 0, 0, false, c.opErr("recv", fmt.Errorf("%w: %d-byte message, %d-byte buffer", ErrMessageTooLong, m.n, len(buf)))
	}
	if m.kept == nil && !held {
		// Released with this message in its receive buffer: no path
		// leaves that (a release follows our Close, which the loop
		// answers, or a device loss, which kept every message), but a
		// buffer given back is never read.
		c.mu.Unlock()
		return 0, 0, false, c.opErr("recv", ErrClosed)
	}
	c.ready.Pop()
	// Counted here, under mu, not with two atomic adds after it: from
	// here on the call returns the message.
	c.stats.msgsRecv++
	c.stats.bytesRecv += uint64(m.n)
	c.mu.Unlock()
	if m.kept != nil {
		if held {
			c.ioDone()
		}
		copy(buf, m.kept)
		return m.n, m.imm, m.hasImm, nil
	}
	copy(buf, c.t.recvBuf(m.slot)[m.off:m.off+m.n])
	err := c.recycle(m.slot)
	c.ioDone()
	if err == nil { // else the message is good; the next call reports the failure
		c.returnCredits()
	}
	return m.n, m.imm, m.hasImm, nil
}

// io guards the buffers and the QP against Close releasing them while a
// copy or a post is under way. It is held only around work that does not
// block, never while waiting.
func (c *Conn) io() bool {
	c.ioMu.RLock()
	if c.released {
		c.ioMu.RUnlock()
		return false
	}
	return true
}

func (c *Conn) ioDone() { c.ioMu.RUnlock() }

// recycle queues a consumed receive buffer for reposting and reposts the
// queue as one chain once it holds recvBatch buffers, or at once when the
// peer has said it is out of credit. The caller holds io.
func (c *Conn) recycle(slot int) error {
	c.mu.Lock()
	c.deferred = append(c.deferred, slot)
	flush := len(c.deferred) >= c.recvBatch || c.peerStarved
	// Below the return threshold the buffer is owed until the peer says
	// it is short, in a frame only a round takes: a reader that stops
	// calling held its sender one message below the queue depth for
	// ever (TestConnIdleReaderOwesNoCredit). The reaper takes that frame.
	c.armReapLocked(minReap)
	if !flush {
		// A short peer is owed it even if no read fills the chain: the
		// persist timer reposts and returns it. A frame of ours since
		// the peer said so cleared peerStarved, and a peer one credit
		// short sends nothing that would flush it (it waited for ever).
		c.armPersistLocked()
	}
	c.mu.Unlock()
	if !flush {
		return nil
	}
	return c.flushRecvs()
}

// flushRecvs reposts every queued receive buffer in one chain; they count
// as credits for the peer from then on. The caller holds io.
func (c *Conn) flushRecvs() error {
	c.repostMu.Lock()
	defer c.repostMu.Unlock()
	c.mu.Lock()
	slots := append(c.flushBuf[:0], c.deferred...)
	ctrl := c.deferredCtrl
	c.deferred, c.deferredCtrl = c.deferred[:0], 0
	c.reposting = len(slots)
	c.mu.Unlock()
	if len(slots) == 0 {
		return nil
	}
	if err := c.t.postRecvs(slots); err != nil {
		c.fail(fmt.Errorf("%w: post receive: %w", ErrPeerGone, err))
		return err
	}
	c.mu.Lock()
	c.reposting = 0
	c.pending += len(slots)
	c.ctrlPending += ctrl
	c.noteCreditsLocked()
	c.mu.Unlock()
	return nil
}

// progress makes one round of completion processing. One caller at a time
// polls the completion queue (the leader); others wait until it finishes a
// round, so a sender and a receiver never both sleep on the channel fd.
//
// seen is c.rounds as the caller read it before it checked its condition:
// if a round has ended since, the condition may hold now, and
// waiting for another round could wait for ever (a sender that found no
// credit would sleep behind a receiver's round that waits for the reply to
// the very message the sender holds back).
func (c *Conn) progress(ctx context.Context, seen uint64) error {
	c.mu.Lock()
	if c.rounds.Load() != seen {
		c.mu.Unlock()
		return nil
	}
	_, err := c.progressLocked(ctx, false)
	return err
}

// progressLocked is progress entered with c.mu held since the caller
// checked its condition (so no round can have ended since); it unlocks
// c.mu. It spares a receiver that waits one lock round trip. With keep (a
// waiting Recv's), a round of its own that leaves nothing to do after it
// returns kept, with c.mu and io still held: the Recv looks at its queue
// without taking them again (see endRound).
func (c *Conn) progressLocked(ctx context.Context, keep bool) (kept bool, err error) {
	if c.polling {
		wake := c.waiting.join()
		c.mu.Unlock()
		select {
		case <-wake:
			woken(wake)
			return false, nil
		case <-ctx.Done():
			c.mu.Lock()
			c.waiting.leave(wake)
			c.mu.Unlock()
			return false, ctx.Err()
		}
	}
	if c.err != nil && (!c.rdmaOut || c.releasing || c.cqBroken) {
		// Failed since the caller looked (by the round that just
		// ended): nothing may complete any more, so do not wait. But a
		// one-sided request's flushed completion will come (the failure
		// moved the QP to the error state), and its caller waits for it
		// until release takes the QP.
		c.mu.Unlock()
		return false, nil
	}
	c.polling = true
	c.mu.Unlock()

	var n int
	spun, slept := false, false
	var start time.Time
	if c.busyPoll > 0 && c.spinNext {
		// Spin in slices, each one C call that looks before it spins (so
		// a completion already there costs one call); between slices,
		// look at ctx and the clock.
		window := max(c.spinFor, c.busyPoll)
		for left := window; ; {
			slice := min(left, spinSlice)
			if n, err = c.t.poll(ctx, c.cbuf, slice, false); n > 0 || err != nil {
				break
			}
			now := time.Now()
			if !spun {
				start, spun = now.Add(-slice), true
			}
			c.yieldIfDue(now)
			if left = window - now.Sub(start); left <= 0 || ctx.Err() != nil {
				break
			}
		}
	}
	if n == 0 && err == nil {
		// Not spinning, or spun out: the wait's first poll is the
		// look a non-spinning round takes.
		slept = spun
		n, err = c.t.poll(ctx, c.cbuf, 0, true)
	}
	if n > 0 && !spun {
		// A receiver that always finds completions never spins (or
		// never sleeps, with spinning off).
		c.pollPace.tick(c)
	}
	if n > 0 {
		c.spinNext = true
		if spun && c.gotRecv(n) {
			c.stretchSpin(slept, func() time.Duration { return time.Since(start) })
		}
	}

	return c.endRound(n, err, keep)
}

// endRound handles the n completions of the leader's round and ends it:
// the completions are handled and the round ends in one critical section;
// the reposts go after it (waiters woken a moment earlier find fewer
// credits owed to the peer, which returnCredits below then returns). With
// keep, a round that took completions and leaves nothing for after it (no
// repost, failure to log or credits due) returns kept, with c.mu and io
// held: two lock round trips fewer for a Recv that waited.
func (c *Conn) endRound(n int, err error, keep bool) (kept bool, _ error) {
	held := n > 0 && c.io()
	flush := false
	c.mu.Lock()
	if held {
		before := len(c.deferred)
		for i := 0; i < n; i++ {
			c.handle(&c.cbuf[i])
		}
		// A control frame's buffer goes back at once, as do all queued
		// ones when the peer is out of credit.
		flush = len(c.deferred) > before || (c.peerStarved && len(c.deferred) > 0)
		if c.lostClose {
			// The device went while this round polled: what it took
			// in is copied out of the buffers the release gives back.
			c.keepReadyLocked()
		}
	}
	broken := err != nil && !isWaitEnd(err)
	if broken {
		// The CQ itself failed: the connection cannot continue. Said
		// before the round ends, so that a waiter it wakes sees it.
		c.cqBroken = true
		c.failLocked(fmt.Errorf("%w: %w", ErrPeerGone, err))
	}
	c.polling = false
	c.rounds.Add(1)
	c.waiting.wakeAll()
	logs := c.failureLogsLocked()
	if keep && held && err == nil && !flush && len(logs) == 0 && !c.creditsDue.Load() {
		return true, nil
	}
	c.mu.Unlock()
	if held {
		if flush {
			c.flushRecvs()
		}
		c.ioDone()
	}
	c.logFailures(logs)
	if n > 0 {
		// Reposted buffers are credits to return; a freed send slot may
		// let a return go out that earlier found none.
		c.returnCredits()
	}
	if broken {
		return false, nil
	}
	return false, err
}

// Bounds of the reaper's delay, which doubles while it finds credits out
// and no caller.
const (
	minReap     = 10 * time.Millisecond
	maxReap     = time.Second
	maxReapBusy = 100 * time.Millisecond // while callers poll: ten a second at most
)

// armReapLocked starts the reaper, unless it is armed, to run after d.
// Armed and backed off past a busy connection's bound (it found nobody
// calling), it runs within that bound instead: the application is back,
// and may stop again with credits owed, which waited up to a second
// (TestConnReaperComesBackAfterIdle). Not after d: a connection with
// sparse traffic would back off from 10 ms after every exchange.
func (c *Conn) armReapLocked(d time.Duration) {
	if c.reapArmed && c.reapDelay > maxReapBusy && d < c.reapDelay {
		c.reapDelay = maxReapBusy
		c.reapTimer.Reset(maxReapBusy)
		return
	}
	if c.reapArmed || c.raw || c.err != nil || c.closing {
		return
	}
	c.reapArmed, c.reapDelay = true, d
	if c.reapTimer == nil {
		c.reapTimer = time.AfterFunc(d, c.reap)
	} else {
		c.reapTimer.Reset(d)
	}
}

// reap makes a round that does not wait, when no caller is in one, for a
// connection whose application has stopped calling: the credit frames the
// peer sent after taking our messages (each in one of our buffers) are
// taken and their buffers posted again, and what is owed goes back (now or
// by the persist timer). Without it they waited for our application's next
// call, and a peer that had only received could not send its queue depth
// (at depth 2, not one message) until then (found by review). Calls make
// progress themselves: one under way makes the reaper wait for its next
// turn; while credits are out and nobody calls, it comes back, less and
// less often.
func (c *Conn) reap() {
	c.mu.Lock()
	c.reapArmed = false
	if c.err != nil || c.closing || c.releasing {
		c.mu.Unlock()
		return
	}
	if c.polling || c.waiting.len() > 0 {
		// A caller's round takes what there is now; what comes after
		// it returns is ours again (a Recv that timed out and an
		// application gone quiet: found by review).
		if c.reapDueLocked() {
			c.armReapLocked(min(max(2*c.reapDelay, minReap), maxReapBusy))
		}
		c.mu.Unlock()
		return
	}
	c.polling = true
	c.mu.Unlock()
	n, err := c.t.poll(context.Background(), c.cbuf, 0, false)
	c.endRound(n, err, false)
	c.mu.Lock()
	if c.reapDueLocked() {
		c.armReapLocked(min(max(2*c.reapDelay, minReap), maxReap))
	}
	c.mu.Unlock()
}

// reapDueLocked reports whether the reaper should look again: our credits
// are out, or we hold buffers of the peer's that no rule returns yet (those
// of its credit frames), which are its credits: it may run short on them,
// and only a round takes the frame that says so. Those being reposted count:
// a reaper that came during a Recv's repost stopped with them owed
// (TestConnReaperDuringRepostKeepsRunning).
func (c *Conn) reapDueLocked() bool {
	// After the CM's word, until a round has taken the flush in (a
	// device may complete it a moment after the QP's move to the error
	// state): see peerGone.
	return c.credits < c.peerSlots || c.pending+len(c.deferred)+c.reposting > 0 || c.peerLeft != ""
}

// awaitLocked waits, c.mu held, while cond holds, until by: a round's end,
// or a one-sided operation's return, wakes it to look again.
func (c *Conn) awaitLocked(by time.Time, cond func() bool) {
	for cond() && time.Now().Before(by) {
		wake := c.waiting.join()
		c.mu.Unlock()
		t := time.NewTimer(time.Until(by))
		select {
		case <-wake:
		case <-t.C:
		}
		t.Stop()
		c.mu.Lock()
		c.waiting.leave(wake)
	}
}

// gotRecv reports whether the first n completions of the round include a
// receive: only the peer's messages time the peer (a send completion
// arriving during a spin says nothing about it).
func (c *Conn) gotRecv(n int) bool {
	for i := range n {
		if c.cbuf[i].op == compRecv {
			return true
		}
	}
	return false
}

// stretchSpin sets the next wait's busy-poll window from a wait that spun
// and then found a message from the peer after took(). Found within
// busyPoll: the window resets, and stretching is allowed again. Found after
// sleeping: the window stretches to twice took, up to the limit, unless the
// wait took longer than that or stretching is off. Found late by a
// stretched window: the window stays, up to maxLateCatches such waits
// without a short one in between; then it resets and stretching stops (see
// Conn.spinFor). A catch without sleeping by a window not stretched needs
// no clock: the clock read costs half a microsecond under emulation, on
// every message's path.
func (c *Conn) stretchSpin(slept bool, took func() time.Duration) {
	if !slept && c.spinFor <= c.busyPoll {
		c.spinFor, c.lateCatches, c.noStretch = c.busyPoll, 0, false
		return
	}
	d := took()
	limit := max(c.busyPoll, min(maxSpinStretch*c.busyPoll, maxStretchedSpin))
	switch {
	case !slept && d <= c.busyPoll:
		c.spinFor, c.lateCatches, c.noStretch = c.busyPoll, 0, false
	case slept && (c.noStretch || d > limit):
		c.spinFor = c.busyPoll
	case slept:
		c.spinFor = max(c.busyPoll, min(2*d, limit))
	default: // caught late by a stretched window
		if c.lateCatches++; c.lateCatches >= maxLateCatches {
			c.spinFor, c.noStretch = c.busyPoll, true
		}
	}
}

// isWaitEnd reports whether err only ended a wait (the caller's deadline or
// cancellation), leaving the connection usable. A deadline can fire in the
// netpoller a moment before the context's own timer marks it done, so the
// error is what counts, not ctx.Err().
func isWaitEnd(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

// handle processes one completion; c.mu is held.
func (c *Conn) handle(wc *completion) {
	switch wc.op {
	case compSend:
		// Sends complete in post order: this completion is also that of
		// every unsignaled send posted before it.
		for c.inFlight.Len() > 0 {
			s := c.inFlight.Pop()
			c.freeSend = append(c.freeSend, s)
			if s == wc.slot {
				break
			}
		}
		if wc.err != nil {
			c.failedCompletionLocked(wc.err)
		}
	case compRDMA:
		c.rdmaDone, c.rdmaErr, c.rdmaOut = true, wc.err, false
		if wc.err != nil {
			c.failedCompletionLocked(wc.err)
		}
	case compProbe:
		c.probing = false
		if wc.err != nil {
			c.failedCompletionLocked(wc.err)
		}
	case compRecv:
		if wc.err != nil {
			c.failedCompletionLocked(wc.err)
			return
		}
		if c.err != nil && !c.failedByDeviceLossLocked() {
			return
		}
		if err := c.checkRecvLocked(wc); err != nil {
			c.failLocked(err)
			return
		}
		if c.raw {
			if wc.written {
				// A plain verbs peer's write-then-notify: the data is
				// in the region it wrote; the message is the notice.
				wc.n = 0
			}
			c.ready.Push(readyMsg{slot: wc.slot, n: wc.n, imm: wc.imm, hasImm: wc.hasImm})
			return
		}
		h, err := parseFrame(wc.imm, wc.hasImm, wc.n, c.recvSeq, c.maxRecv, c.peerSlots)
		if err == nil && c.peerFin && h.kind != frameCredit {
			// Credit returns may follow a FIN; data may not, nor a
			// second FIN. The application has had, or will have,
			// io.EOF; failLocked counts and logs the failure.
			err = fmt.Errorf("%w: frame of kind %d after the peer's FIN", ErrProtocol, h.kind)
		}
		if err != nil {
			c.failLocked(err)
			return
		}
		c.recvSeq++
		if c.credits+int(h.credits) > c.peerSlots { // checked before kept
			c.failLocked(fmt.Errorf("%w: peer returned more credits than it was owed", ErrProtocol))
			return
		}
		c.credits += int(h.credits)
		c.peerShort = h.flags&flagStarved != 0
		if c.peerShort {
			c.peerStarved = true
		}
		switch h.kind {
		case frameData:
			c.persistDelay = minPersist
			m := readyMsg{slot: wc.slot, n: wc.n}
			if h.flags&flagImm != 0 {
				m.off, m.n, m.hasImm = userImmLen, wc.n-userImmLen, true
				m.imm = binary.BigEndian.Uint32(c.t.recvBuf(wc.slot))
			}
			c.ready.Push(m)
		case frameFin:
			c.peerFin = true
			c.deferred = append(c.deferred, wc.slot)
			c.deferredCtrl++
		default:
			c.deferred = append(c.deferred, wc.slot)
			c.deferredCtrl++
		}
		if c.peerShort {
			// A short peer may be owed what no rule returns at once,
			// and new credits may let the persist timer send: re-arm
			// it. Otherwise nothing creditsDue reads changed here.
			c.noteCreditsLocked()
		}
	}
}

// fail breaks the connection once: every waiter wakes with err.
func (c *Conn) fail(err error) { c.logFailures(c.failTaking(err)) }

// failTaking is fail, but returns the failures to log (failureLogsLocked).
func (c *Conn) failTaking(err error) []error {
	c.mu.Lock()
	c.failLocked(err)
	logs := c.failureLogsLocked()
	c.mu.Unlock()
	return logs
}

// failureLogsLocked takes the failures noted for the log (failLogs), which
// the caller passes to logFailures once it has released mu and io. While
// the connection joins it takes none: start logs them if it hands the
// connection out, and drops them with a connection it drops.
func (c *Conn) failureLogsLocked() []error {
	if c.joining {
		return nil
	}
	logs := c.failLogs
	c.failLogs = nil
	return logs
}

// logFailures logs each failure taken by failureLogsLocked, at Warn.
func (c *Conn) logFailures(logs []error) {
	for _, err := range logs {
		c.log("connection failed", "remote", c.raddr, "err", err)
	}
}

// checkRecvLocked vets a receive completion the device reported, whose
// length and kind come from the peer: a goxrc peer only sends, and no
// message is longer than its receive buffer. The peer's RDMA write with
// immediate data also consumes a receive, reporting the write's length.
func (c *Conn) checkRecvLocked(wc *completion) error {
	if wc.written && !c.raw {
		return fmt.Errorf("%w: the peer's RDMA write with immediate data consumed a receive (goxrc peers only send)", ErrProtocol)
	}
	if !wc.written && (wc.n < 0 || wc.n > len(c.t.recvBuf(wc.slot))) {
		return fmt.Errorf("%w: received %d bytes into a %d-byte buffer", ErrProtocol, wc.n, len(c.t.recvBuf(wc.slot)))
	}
	return nil
}

// failedCompletionLocked fails the Conn for a failed work request. A flush
// fails every request posted, so only the first failure is formatted.
func (c *Conn) failedCompletionLocked(err error) {
	switch {
	case c.err != nil:
	case c.peerLeft != "":
		c.failLocked(fmt.Errorf("%w: %s", ErrPeerGone, c.peerLeft))
	default:
		var ce *verbs.CompletionError
		if errors.As(err, &ce) {
			err = &requestFailed{ce}
		} else {
			err = fmt.Errorf("%w: %w", ErrPeerGone, err)
		}
		c.failLocked(err)
	}
}

// closedErrLocked is err, the connection's failure, but ErrClosed after our
// Close where nothing broke it (no failure, or the peer's orderly end, or a
// raw peer's disconnect): every call after Close answers so, as over XRC
// (Close's doc). The Close a device loss makes is not the application's:
// after the peer's end, its calls said ErrClosed where they said the peer
// was gone (TestDeviceLostAfterPeerEndIsNotClosed).
func (c *Conn) closedErrLocked(err error) error {
	if c.closing && !c.broke && !c.lostClose {
		return ErrClosed
	}
	return err
}

func (c *Conn) failLocked(err error) {
	if c.err != nil {
		return
	}
	c.err = err
	// After the peer's FIN, the flush that follows its disconnect is the
	// expected end, not a failure; so is a raw peer's disconnect (raw
	// messages have no FIN). A framed peer that disconnects without one
	// broke the connection (its process died, say), as does a frame that
	// breaks the protocol, after the FIN too: the CM's word of the
	// disconnect may come before a round takes that frame in.
	orderlyEnd := (c.peerFin || c.raw) && c.peerLeft != "" && !errors.Is(err, ErrProtocol)
	if !c.broke && !errors.Is(err, ErrClosed) && !orderlyEnd {
		c.broke = true
		c.failLogs = append(c.failLogs, err) // logged once mu is released: see failLogs
		c.stats.errors.Add(1)
	}
	// Flush everything posted, which also wakes a leader asleep in poll.
	c.t.shutdown()
}

// peerGone is called when the CM reports the peer disconnected. The QP is
// flushed rather than the connection failed at once: completions queued
// before the flush (the peer's last messages, its FIN) are processed first,
// so a graceful close still reads as io.EOF after the data. Where no call
// is polling, the reaper's round takes the flush in now: an idle
// connection's Stats said no error for a dead peer until the application's
// next call, where XRC's engine counts it on its own.
func (c *Conn) peerGone(reason string) {
	c.mu.Lock()
	if c.peerLeft == "" {
		c.peerLeft = reason
	}
	c.mu.Unlock()
	c.t.shutdown()
	c.reap()
}

// deviceRemoved fails the connection and releases it at once, without
// waiting for the application's Close: the kernel cannot finish removing
// the device while anything of ours is left on it.
func (c *Conn) deviceRemoved() { c.deviceLost("") }

// deviceLost is deviceRemoved with the reason the device gave, if any.
func (c *Conn) deviceLost(why string) { c.logFailures(c.loseDevice(why)) }

// loseDevice is deviceLost, but returns the failures to log
// (failureLogsLocked).
func (c *Conn) loseDevice(why string) []error {
	err := fmt.Errorf("%w: %w", ErrPeerGone, ErrDeviceRemoved)
	if why != "" {
		err = fmt.Errorf("%w: %s", err, why)
	}
	held := c.io()
	c.mu.Lock()
	if held && c.err == nil && !c.closing && !c.polling {
		// Take in what the device completed before it went, as a round
		// would (the peer's last messages, its FIN): XRC's engine, which
		// polls on its own, has. A flushed request fails the connection
		// by the loss, not by the flush.
		c.polling = true
		c.mu.Unlock()
		n, _ := c.t.poll(context.Background(), c.cbuf, 0, false)
		c.mu.Lock()
		for i := range n {
			if c.cbuf[i].err != nil {
				c.failLocked(err)
			}
			c.handle(&c.cbuf[i])
		}
		c.polling = false
		c.rounds.Add(1)
		c.waiting.wakeAll()
	}
	c.failLocked(err)
	c.devLost = true
	if !c.closing {
		// The Close below is cm's (see closedErrLocked). A loss that
		// finds closing set leaves lostClose as it is: the application's
		// Close reset it (close's app), and a second loss (the CM's
		// DEVICE_REMOVAL after DEVICE_FATAL, async.go) must not take the
		// Close the first started for the application's
		// (TestDeviceFatalThenRemovalIsNotClosed).
		c.lostClose = true
		if held {
			c.keepReadyLocked()
		}
	}
	logs := c.failureLogsLocked()
	c.mu.Unlock()
	if held {
		c.ioDone()
	}
	go c.close(false, false)
	return logs
}

// failedByDeviceLossLocked reports whether the connection failed first by
// its device's loss (not our Close): a round that polled as the device went
// still takes in the messages that had arrived whole, which Recv gives
// (the release waits for that round, so their buffers are still there).
func (c *Conn) failedByDeviceLossLocked() bool {
	return c.lostClose && errors.Is(c.err, ErrDeviceRemoved)
}

// keepReadyLocked copies the messages taken in and not yet read out of
// their receive buffers, which the release gives back with the device:
// Recv still gives them (the peer's Send completed, its Close returned
// nil), as over XRC, whose engine holds what it took in. The caller holds
// io.
func (c *Conn) keepReadyLocked() {
	for i := range c.ready.Len() {
		m := c.ready.At(i)
		if m.kept == nil {
			m.kept = append(make([]byte, 0, m.n), c.t.recvBuf(m.slot)[m.off:m.off+m.n]...)
		}
	}
}

// peerVanishedLocked reports whether the connection failed because the peer
// stopped answering without a word: the transport's retries ran out (a send,
// or a keepalive probe) and the CM never reported a disconnect. A peer
// whose process died has its kernel disconnect for it; a vanished node
// (power lost, cable cut) does not.
func (c *Conn) peerVanishedLocked() bool {
	var ce *verbs.CompletionError
	return c.peerLeft == "" && errors.As(c.err, &ce) && ce.Status == verbs.WCRetryExcErr
}

// Close closes the connection gracefully: it wakes blocked Sends and Recvs
// (each returns ErrClosed; a one-sided operation in flight returns ErrClosed
// once its request is flushed, or at the latest once the QP is gone, its
// memory in the device's hands until then), tells the peer no more data follows
// (waiting, bounded by the handshake timeout, for a receive buffer at the
// peer to take that), waits (bounded as well) for posted messages to
// complete, disconnects, waits for the CM's time-wait to end, and releases
// every resource. A connection whose peer vanished (its retries ran out with
// no disconnect from the CM) is released at once, with no one to wait for;
// with WithKeepalive, probes go on while Close waits, and find such a peer.
// Over XRC, Close is xrc.Conn.Close, bounded by the handshake timeout as
// well: a peer that vanished may cost that wait, or the engine's verdict on
// the silent receiver, before Close returns. Close is idempotent. Send and
// Recv after Close return ErrClosed (or the failure that broke the
// connection before), Recv also where messages or the peer's end of stream
// were still to be read.
func (c *Conn) Close() error {
	if err := c.ownClose(false); err != nil {
		return opError("close", c.raddr, err)
	}
	return nil
}

// ownClose is close for the application (Close, the adapter's Close).
func (c *Conn) ownClose(background bool) error { return c.close(background, true) }

// close is Close. With background it returns once the graceful part is
// done, and the release, with its wait for the CM's time-wait (2 s on
// soft-RoCE), goes on in a goroutine of its own, as a TCP socket leaves its
// TIME_WAIT to the kernel: the net.Conn adapter's Close, which net/http
// calls in turn for every connection while holding its lock. A release
// error is then logged. app says the application closes c: from then on
// its calls say ErrClosed, also where a device loss closed c first (see
// closedErrLocked). That is settled where closing is set: a device loss
// between the two took the application's Close for its own (a lock of
// ownClose's before this one's).
func (c *Conn) close(background, app bool) error {
	if !c.ok() {
		return nil
	}
	if c.x != nil {
		return c.closeXRC()
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	c.mu.Lock()
	if app {
		c.lostClose = false
	}
	first := !c.closing
	c.closing = true
	broken := c.err != nil
	vanished := c.peerVanishedLocked()
	c.mu.Unlock()
	if first {
		// Blocked calls see closing and return; the FIN and the drain
		// below then have the connection to themselves.
		c.t.interrupt()
		if !broken && !c.raw {
			c.sendFinOnce(ctx)
		}
		if !broken {
			c.drainSends(ctx)
		}
		close(c.graceful)
	} else {
		// The first Close may still be sending its FIN or draining:
		// releasing now would shut the QP under them.
		select {
		case <-c.graceful:
		case <-ctx.Done():
		}
	}
	// The FIN or the drain may have found the peer vanished. A lost
	// device's connection is released at once too: its QP is destroyed,
	// not kept for reuse, so no time-wait is waited for (after a
	// DEVICE_FATAL, until a TIMEWAIT_EXIT or DEVICE_REMOVAL that may never
	// come, holding the dead device and the application's Close).
	c.mu.Lock()
	vanished = vanished || c.peerVanishedLocked() || c.devLost
	c.mu.Unlock()
	if background {
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
			defer cancel()
			if err := c.release(ctx, vanished); err != nil {
				c.log("release after close failed", "remote", c.raddr, "err", err)
			}
		}()
		return nil
	}
	return c.release(ctx, vanished)
}

// release fails the connection (ErrClosed) and frees everything, once;
// every call returns the first's result.
func (c *Conn) release(ctx context.Context, vanished bool) error {
	c.releaseOnce.Do(func() {
		defer close(c.freed)
		if c.kaStop != nil {
			close(c.kaStop)
		}
		c.fail(ErrClosed)
		c.mu.Lock()
		if c.persistTimer != nil {
			c.persistTimer.Stop()
		}
		if c.reapTimer != nil {
			c.reapTimer.Stop()
		}
		// A one-sided request's flushed completion follows the failure
		// (the QP is in the error state): rounds go on until its caller
		// has it and returns, briefly, so that the caller and its region
		// need not wait for the rest of the release (the CM's time-wait).
		c.awaitLocked(time.Now().Add(flushWait), func() bool { return c.rdmaWaiting && !c.cqBroken })
		c.releasing = true
		c.mu.Unlock()
		// A poll asleep now wakes, sees releasing and ends its round.
		c.t.interrupt()
		c.mu.Lock()
		// A polling leader may still be in its last poll, whose completion
		// array the release reuses to drain the CQ: wait for its round to
		// end (the failure woke it; no round starts after it), whatever
		// ctx has left.
		c.awaitLocked(time.Now().Add(flushWait), func() bool { return c.polling })
		c.mu.Unlock()
		c.ioMu.Lock()
		c.released = true
		c.ioMu.Unlock()
		c.releaseErr = c.t.release(ctx, vanished)
		globalStats.connsOpen.Add(-1)
	})
	return c.releaseErr
}

// sendFinOnce posts our FIN unless it is posted already. A call posting it
// (CloseWrite, waiting for a credit) is waited for, bounded by ctx, and if
// it gave up, this call tries in turn. Close released the QP under a
// CloseWrite that waited for a credit for the FIN, which was lost (the peer
// saw a disconnect without it, a failure); and after a CloseWrite that gave
// up (its timeout passed, the peer frozen), Close sent no FIN, nor did
// CloseWrite again, which returned nil.
func (c *Conn) sendFinOnce(ctx context.Context) error {
	c.mu.Lock()
	for c.finBusy != nil {
		busy := c.finBusy
		c.mu.Unlock()
		select {
		case <-busy:
		case <-ctx.Done():
			return ctx.Err()
		}
		c.mu.Lock()
	}
	if c.finPosted {
		c.mu.Unlock()
		return nil
	}
	busy := make(chan struct{})
	c.finBusy = busy
	c.mu.Unlock()
	err := c.sendFin(ctx)
	c.mu.Lock()
	c.finPosted = err == nil
	c.finBusy = nil
	c.mu.Unlock()
	close(busy)
	return err
}

// sendFin posts our FIN, waiting for a send slot and a credit (a FIN may
// take the credit that data leaves for credit returns).
func (c *Conn) sendFin(ctx context.Context) error {
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		seen := c.rounds.Load()
		// The FIN carries the buffers consumed so far (see
		// postFrameLocked): repost those queued, or wait for the chain
		// another call is posting (repostMu).
		if c.io() {
			c.flushRecvs()
			c.ioDone()
		}
		err := c.postFrame(frameFin, nil, 0, false)
		if err == nil || !errors.Is(err, errNoRoom) {
			return err
		}
		c.mu.Lock()
		reposts := len(c.deferred) + c.reposting
		c.mu.Unlock()
		if reposts > 0 {
			continue // queued since: no round need end for them
		}
		if err := c.progress(ctx, seen); err != nil {
			return err
		}
	}
}

// CloseWrite ends this side's stream, as TCP's half-close does: the peer's
// Recv returns io.EOF once it has read every message sent before, while
// the peer's messages keep coming until its own Close or CloseWrite. Send
// fails with ErrClosed from then on (one blocked on credits too); Close
// still ends the connection. It waits (bounded by the handshake timeout)
// only for room to post the end of the stream, never for the peer. Raw
// connections (WithRawMessages) have no end-of-stream frame:
// ErrNotSupported. XRC connections half-close too (xrc.Conn.CloseWrite).
// CloseWrite is idempotent: once one returned nil, later ones return nil,
// whatever came since (the peer's Close or death, a device loss), until
// Close. A first one after the peer's Close or death returns ErrPeerGone,
// as Send does, once this side has heard of it (on RC the CM's word of the
// disconnect, which may come after Recv's io.EOF; on XRC the peer's FIN,
// which Recv's io.EOF follows); before, the half-close goes and it
// returns nil, as a TCP half-close after the peer's close does.
func (c *Conn) CloseWrite() error {
	if !c.ok() {
		return ErrClosed
	}
	if c.x != nil {
		return c.closeWriteXRC()
	}
	if c.raw {
		return c.opErr("close write", fmt.Errorf("%w: raw messages have no end-of-stream frame", ErrNotSupported))
	}
	c.mu.Lock()
	if c.wroteEnd.Load() && (!c.closing || c.lostClose) {
		c.mu.Unlock()
		return nil
	}
	if err := c.closedErrLocked(c.err); err != nil || c.closing {
		c.mu.Unlock()
		if err == nil {
			err = ErrClosed
		}
		return c.opErr("close write", err)
	}
	if c.peerLeft != "" {
		// The CM said the peer went, before a poll took the flush in:
		// no FIN reaches it. ErrPeerGone, as after that poll, and as
		// over XRC once its engine heard of the death.
		err := fmt.Errorf("%w: %s", ErrPeerGone, c.peerLeft)
		c.mu.Unlock()
		return c.opErr("close write", err)
	}
	// Data frames are refused from here on, so every one posted comes
	// before the FIN.
	c.writeClosed = true
	c.mu.Unlock()
	// A Send waiting for credits sees that now: with none for the FIN
	// either, nothing would complete to wake it
	// (TestCloseWriteWakesBlockedSend).
	c.t.interrupt()
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	if err := c.sendFinOnce(ctx); err != nil {
		return c.opErr("close write", err)
	}
	c.wroteEnd.Store(true)
	return nil
}

// drainSends waits until every posted send has completed, so the peer has
// the data before the disconnect.
func (c *Conn) drainSends(ctx context.Context) {
	for {
		c.mu.Lock()
		done := len(c.freeSend) == cap(c.freeSend) || c.err != nil
		seen := c.rounds.Load()
		c.mu.Unlock()
		if done || c.progress(ctx, seen) != nil {
			return
		}
	}
}

func (c *Conn) opErr(op string, err error) error {
	if errors.Is(err, ErrClosed) && !errors.Is(err, ErrPeerGone) {
		err = ErrClosed
	}
	return opError(op, c.raddr, err)
}

type connStats struct {
	msgsSent, bytesSent atomic.Uint64
	msgsRecv, bytesRecv uint64 // under the Conn's mu: Recv pops under it
	creditFrames        atomic.Uint64
	keepalives          atomic.Uint64
	errors              atomic.Uint64
}
