package xrc

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math/bits"
	"net/netip"
	"slices"
	"syscall"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/internal/ring"
	"github.com/goxrc/goxrc/verbs"
	"github.com/goxrc/goxrc/xrc/internal/wire"
)

// Conn is a logical connection: two one-way legs, ours sending over our
// uplink to the peer's node into the peer's SRQ, the peer's sending over its
// uplink into ours. Messages keep their boundaries. Every message carries
// the receiver's tag; a receiver drops messages whose tag names no live
// connection of its own.
type Conn struct {
	e     *Endpoint
	raddr netip.AddrPort // the peer endpoint's listening address

	// All below under e.mu.
	inbound bool

	// sending leg
	sendTag  uint32 // our REQ's ConnTag (FIN's SenderTag)
	up       *uplink
	holdsRef bool
	peerTag  uint32 // the receiver's tag: the Imm of every send
	peerSRQN uint32
	peerInc  uint64
	sendUp   bool
	sendDone bool // FIN sent or leg dropped
	lastSent time.Time

	// Flow control (xrc-protocol.md, "Flow control"). Counts wrap: only
	// their differences mean anything.
	sendWindow uint32        // the receiver's window, from its ACCEPT (or REQ)
	sent       uint32        // data messages that took a credit
	sendSeq    uint32        // the next data message's sequence number
	unsettled  []uint32      // numbers of data messages whose Send has not returned
	spanWait   bool          // a sender waits in spanFullLocked
	creditWait bool          // a sender waits for acked to grow
	acked      uint32        // of those, taken by the receiver's Recv (its credit frames)
	credited   chan struct{} // closed and replaced when a waiter's wait ends (creditWait, spanWait)
	consumed   uint32        // data messages our Recv took
	returned   uint32        // consumed, as the last credit frame we sent said
	returning  bool          // returnCredits is running
	returnFn   func()        // c.returnCredits, made once: a method value allocates

	// receiving leg
	recvLeg      *Leg
	recvTag      uint32
	recvUp       bool
	recvReleased bool
	lastSeen     time.Time
	goneAt       time.Time // the sender's INI was torn down
	goneDrains   uint64    // e.drains then
	finRcvd      bool
	earlyTag     uint32            // the receive tag announced in a FlagOneExchange VIRT_REQ, until registered
	early        []earlyMsg        // messages for earlyTag that came before the registration
	rev          *wire.Accept      // the forward ACCEPT, when it carries the reverse leg
	q            ring.Ring[[]byte] // data frames (kind and number included) for Recv (made with the first, maxQueued long)
	seen         replayWindow      // data sequence numbers taken (made with the first message)
	wakeCh       chan struct{}

	userClosed bool
	closing    bool
	isReady    bool
	finished   bool
	err        error
	ready      chan struct{}
	done       chan struct{}
}

func (e *Endpoint) newConnLocked(raddr netip.AddrPort) *Conn {
	c := &Conn{e: e, raddr: raddr, wakeCh: make(chan struct{}, 1), ready: make(chan struct{}), done: make(chan struct{}),
		credited: make(chan struct{})}
	c.returnFn = c.returnCredits
	e.conns[c] = struct{}{}
	return c
}

// LocalAddr is our endpoint's listening address.
func (c *Conn) LocalAddr() netip.AddrPort { return c.e.addr }

// RemoteAddr is the peer endpoint's listening address.
func (c *Conn) RemoteAddr() netip.AddrPort { return c.raddr }

func (c *Conn) failed() bool { return c.err != nil }

func (c *Conn) errOr(def error) error {
	c.e.mu.Lock()
	defer c.e.mu.Unlock()
	if c.err != nil {
		return c.err
	}
	return def
}

func (c *Conn) wake() {
	select {
	case c.wakeCh <- struct{}{}:
	default:
	}
}

// Send sends p as one message and returns once it sits in the receiver's
// queue (the send completed). Across an uplink recovery the message is sent
// again on the new INI; its sequence number lets the receiver drop the copy
// if the first one arrived after all.
func (c *Conn) Send(ctx context.Context, p []byte) error {
	if len(p) > MaxMessageSize {
		return &opError{"send", c.raddr.String(), errors.New("message too long")}
	}
	return c.sendFrame(ctx, kindData, p, false)
}

// sendFrame sends one frame and waits for its completion, sending it again
// across an uplink recovery. A data frame first takes a credit, waiting for
// one if the receiver's window is full. A send that fails gives its credit
// back, posted or not: a message whose fate is unknown (the caller gave up
// waiting for its completion) may still arrive, and then the receiver's
// count runs one ahead, which creditAck's cap absorbs; a credit kept for a
// message that never arrives would be lost for good. Internal frames (FIN,
// credits) take none: the engine, not the application, consumes them.
func (c *Conn) sendFrame(ctx context.Context, kind byte, p []byte, internal bool) (err error) {
	e := c.e
	took := false
	var seq uint32
	defer func() {
		if !took {
			return
		}
		e.mu.Lock()
		if err != nil && c.sent != c.acked { // else the receiver took it already
			c.sent--
		}
		c.settleLocked(seq)
		e.mu.Unlock()
	}()
	for try := 0; try < 16; try++ {
		e.mu.Lock()
		switch {
		case c.userClosed && !internal:
			e.mu.Unlock()
			return &opError{"send", c.raddr.String(), ErrClosed}
		case c.err != nil:
			err := c.err
			e.mu.Unlock()
			return &opError{"send", c.raddr.String(), err}
		case c.finRcvd && !internal:
			e.mu.Unlock()
			return &opError{"send", c.raddr.String(), ErrPeerClosed}
		case !c.sendUp || c.sendDone:
			e.mu.Unlock()
			return &opError{"send", c.raddr.String(), ErrClosed}
		}
		if kind == kindData && !took {
			if full := c.sent-c.acked >= c.sendWindow; full || c.spanFullLocked() {
				if full {
					c.creditWait = true
				}
				ch := c.credited
				e.mu.Unlock()
				select {
				case <-ch:
				case <-c.done:
				case <-e.ctx.Done():
					return &opError{"send", c.raddr.String(), ErrClosed}
				case <-ctx.Done():
					return ctx.Err()
				}
				try-- // waiting for credits is no failed try
				continue
			}
			c.sent++
			took = true
			seq = c.sendSeq
			c.sendSeq++
			c.unsettled = append(c.unsettled, seq)
		}
		u := c.up
		if u.state != upUp {
			ch := u.changed
			e.mu.Unlock()
			select {
			case <-ch:
			case <-c.done:
			case <-ctx.Done():
				return ctx.Err()
			}
			continue
		}
		e.mu.Unlock()
		ch := statusChans.get(newStatusChan)
		switch res, room := c.post(kind, seq, p, ch); res {
		case postFull:
			statusChans.put(ch) // its waiter was never seen by a poller
			select {
			case <-room:
			case <-c.done:
			case <-e.ctx.Done():
				return &opError{"send", c.raddr.String(), ErrClosed}
			case <-ctx.Done():
				return ctx.Err()
			}
			try-- // waiting for the send queue is no failed try
			continue
		case postFailed:
			// Not reused: a poller flushing the INI may have taken its
			// waiter and still send to it.
			continue
		}
		select {
		case st := <-ch:
			// The poller sent the one status it had for it: free to reuse.
			// (A wait that gave up leaves its channel to the collector.)
			statusChans.put(ch)
			switch st {
			case verbs.WCSuccess:
				return nil
			case verbs.WCRemInvReqErr:
				return &opError{"send", c.raddr.String(), errSRQGone}
			}
			// Flushed or retries exhausted: the uplink recovers; again.
		case <-e.ctx.Done():
			// The endpoint is closing: its completion pollers are
			// gone, so no completion will come.
			return &opError{"send", c.raddr.String(), ErrClosed}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	c.fail(errRetries)
	return &opError{"send", c.raddr.String(), errRetries}
}

// spanFullLocked reports whether the next data message's number would be
// the receiver's replay span or more ahead of one whose Send has not
// returned: that one, sent again or posted late, could then arrive behind
// the receiver's window and be taken for a duplicate. The sender waits
// (for credits, as it were) until that Send returns.
func (c *Conn) spanFullLocked() bool {
	span := replaySpan(int(c.sendWindow))
	for _, s := range c.unsettled {
		if c.sendSeq-s >= span {
			c.spanWait = true
			return true
		}
	}
	return false
}

// settleLocked ends the wait of seq's Send and wakes a sender waiting for it.
func (c *Conn) settleLocked(seq uint32) {
	c.unsettled = slices.DeleteFunc(c.unsettled, func(s uint32) bool { return s == seq })
	if c.spanWait {
		c.spanWait = false
		close(c.credited)
		c.credited = make(chan struct{})
	}
}

// statusChans and sendWRs keep a Send from allocating: a channel for its
// completion's status, and the one-request array for PostSend.
var (
	statusChans = make(freeList[chan verbs.WCStatus], 1024)
	sendWRs     = make(freeList[*[1]kernel.SendWR], 1024)
)

func newStatusChan() chan verbs.WCStatus { return make(chan verbs.WCStatus, 1) }
func newSendWRs() *[1]kernel.SendWR      { return new([1]kernel.SendWR) }

// freeList keeps spare values for reuse, up to its capacity. A buffered
// channel rather than a sync.Pool: a pool drops what it holds at each
// garbage collection, and some at random under the race detector.
type freeList[T any] chan T

func (f freeList[T]) get(mk func() T) T {
	select {
	case v := <-f:
		return v
	default:
		return mk()
	}
}

func (f freeList[T]) put(v T) {
	select {
	case f <- v:
	default:
	}
}

// postResult is what became of a post.
type postResult uint8

const (
	posted     postResult = iota
	postFailed            // not posted: the leg or the INI is down (recovery started), or a retry is due
	postFull              // not posted: the INI's send queue is full; wait for room and post again
)

// post posts one frame on the uplink's current INI; ch (if not nil) gets
// the completion status. A data frame carries seq after its kind byte. A
// full send queue (ENOMEM: completions not yet polled hold every slot) is
// no error of the INI: the caller waits on room, closed once the INI's
// poller has taken completions, and posts again.
func (c *Conn) post(kind byte, seq uint32, p []byte, ch chan verbs.WCStatus) (res postResult, room <-chan struct{}) {
	e := c.e
	e.mu.Lock()
	u := c.up
	if !c.sendUp || c.sendDone && kind != kindFIN || c.err != nil || u == nil || u.state != upUp {
		e.mu.Unlock()
		return postFailed, nil
	}
	q := u.cur
	q.nextWR++
	wr := kernel.SendWR{WRID: q.nextWR, RemoteSRQN: c.peerSRQN, Imm: c.peerTag}
	q.waiters[wr.WRID] = waiter{c: c, ch: ch}
	c.lastSent = time.Now()
	e.mu.Unlock()
	hdr := 1
	if kind == kindData {
		hdr += dataSeqLen
	}
	// PostSend copies the frame: it and the request array are reused.
	frame := kernel.NewPayload(hdr + len(p))
	defer kernel.FreePayload(frame)
	frame[0] = kind
	if kind == kindData {
		binary.BigEndian.PutUint32(frame[1:], seq)
	}
	copy(frame[hdr:], p)
	wr.Payload = frame
	wrs := sendWRs.get(newSendWRs)
	wrs[0] = wr
	err := e.k.PostSend(q.qp, wrs[:])
	wrs[0] = kernel.SendWR{}
	sendWRs.put(wrs)
	if err != nil {
		e.mu.Lock()
		defer e.mu.Unlock()
		_, mine := q.waiters[wr.WRID] // else a poller flushing the INI took the waiter
		delete(q.waiters, wr.WRID)
		if errors.Is(err, syscall.ENOMEM) && mine {
			if len(q.waiters) == 0 {
				return postFailed, nil // polled meanwhile: post again at once (a try)
			}
			q.roomWait = true
			e.sqFull.Add(1)
			return postFull, q.room
		}
		e.failINILocked(u, q)
		return postFailed, nil
	}
	return posted, nil
}

// Recv waits for the next message and copies it into buf. A message longer
// than buf is truncated, with io.ErrShortBuffer. After the peer's FIN and
// the messages before it, Recv returns io.EOF.
func (c *Conn) Recv(ctx context.Context, buf []byte) (int, error) {
	e := c.e
	for {
		e.mu.Lock()
		if c.userClosed {
			e.mu.Unlock()
			return 0, &opError{"recv", c.raddr.String(), ErrClosed}
		}
		if c.q.Len() > 0 {
			frame := c.q.Pop()
			if c.q.Len() > 0 {
				c.wake()
			}
			c.consumed++
			if c.consumed-c.returned >= creditThreshold(e.cfg.RecvWindow) && !c.returning {
				c.returning = e.spawn(c.returnFn)
			}
			e.mu.Unlock()
			m := frame[1+dataSeqLen:]
			n := copy(buf, m)
			short := n < len(m)
			kernel.FreePayload(frame)
			if short {
				return n, io.ErrShortBuffer
			}
			return n, nil
		}
		if c.finRcvd {
			e.mu.Unlock()
			return 0, io.EOF
		}
		if c.err != nil {
			err := c.err
			e.mu.Unlock()
			return 0, &opError{"recv", c.raddr.String(), err}
		}
		e.mu.Unlock()
		select {
		case <-c.wakeCh:
		case <-c.done:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// creditLen is the body of a credit frame: the receiver's count of data
// messages its application has taken, uint32, wrapping.
const creditLen = 4

// creditThreshold is how many taken messages a receiver lets pile up before
// it returns their credits: half the window, so a sender that keeps the
// window full gets credits back before it runs out, at one credit frame per
// half window.
func creditThreshold(window int) uint32 { return uint32(max(1, window/2)) }

// replaySpan is how many sequence numbers a receiver with this window
// remembers (replayWindow): twice the window, rounded up to a power of two
// of at least 64 (whole words, and a ring that divides 2^32, so it stays
// consistent across the numbers' wrap).
func replaySpan(window int) uint32 {
	return max(64, uint32(1)<<bits.Len(uint(2*max(window, 1)-1)))
}

// maxQueued is how many received messages a connection holds before it
// takes its peer for broken: twice the window. A sender keeps within the
// window; the slack covers a message whose Send gave up (and its credit
// back) that arrived after all, which the receiver counts and the sender
// does not.
func maxQueued(window int) int { return 2 * window }

// returnCredits sends credit frames while the application has taken at
// least a threshold of messages since the last one. Each frame carries the
// running count, not a difference: a frame sent twice or late (across an
// uplink recovery) changes nothing. One runs per connection at a time; it
// ends when nothing more is due or the sending leg is gone.
func (c *Conn) returnCredits() {
	e := c.e
	for {
		e.mu.Lock()
		v := c.consumed
		if v-c.returned < creditThreshold(e.cfg.RecvWindow) || c.err != nil || c.finRcvd || c.sendDone || !c.sendUp {
			c.returning = false
			e.mu.Unlock()
			return
		}
		c.returned = v
		e.mu.Unlock()
		var b [creditLen]byte
		binary.BigEndian.PutUint32(b[:], v)
		if err := c.sendFrame(e.ctx, kindCredit, b[:], true); err != nil {
			e.mu.Lock()
			c.returning = false
			e.mu.Unlock()
			return
		}
		e.creditSent.Add(1)
	}
}

// creditedLocked takes a credit frame's body. It reports false for a
// malformed one.
func (c *Conn) creditedLocked(body []byte) bool {
	acked, ok := creditAck(body, c.acked, c.sent)
	if !ok {
		return false
	}
	if acked != c.acked {
		c.acked = acked
		if c.creditWait {
			c.creditWait = false
			close(c.credited)
			c.credited = make(chan struct{})
		}
	}
	return true
}

// creditAck decodes a credit frame's body (the receiver's running count of
// messages taken) and returns the new count of our messages taken, given
// the current one and the count sent. A count behind acked is a late frame
// and changes nothing; one ahead of sent is capped at it (the receiver
// counts a message whose Send gave its credit back). So a peer's frame never
// moves acked back, nor past what was sent.
func creditAck(body []byte, acked, sent uint32) (uint32, bool) {
	if len(body) != creditLen {
		return acked, false
	}
	d := binary.BigEndian.Uint32(body) - acked
	if int32(d) <= 0 {
		return acked, true
	}
	return acked + min(d, sent-acked), true
}

// Close ends the connection gracefully: a FIN is the last message on our
// leg, then our reference on the uplink goes (at zero the uplink's physical
// link is disconnected and its INI destroyed after TIMEWAIT_EXIT). Our
// receiving leg ends when the peer's FIN arrives (the peer answers ours
// with its own) or its sender goes silent. Close is idempotent.
func (c *Conn) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), c.e.cfg.HandshakeTimeout)
	defer cancel()
	c.e.mu.Lock()
	c.userClosed = true
	c.wake()
	c.e.mu.Unlock()
	c.close(ctx)
	return nil
}

func (c *Conn) close(ctx context.Context) {
	e := c.e
	e.mu.Lock()
	if c.closing {
		e.mu.Unlock()
		return
	}
	c.closing = true
	fin := c.sendUp && !c.sendDone && c.err == nil
	f := wire.FIN{Tag: c.peerTag, SenderTag: c.sendTag}
	e.mu.Unlock()
	if fin {
		b := make([]byte, wire.FinLen)
		if _, err := f.Encode(b); err == nil {
			c.sendFrame(ctx, kindFIN, b, true)
		}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if c.err == nil && !c.isReady {
		c.failLocked(ErrClosed) // a half-open connection has no peer to say FIN
		return
	}
	c.dropSendLocked()
	c.maybeFinishLocked()
}

// fail ends the connection at once, without FIN.
func (c *Conn) fail(err error) {
	c.e.mu.Lock()
	defer c.e.mu.Unlock()
	c.failLocked(err)
}

func (c *Conn) failLocked(err error) {
	if c.err != nil || c.finished {
		return
	}
	c.err = err
	c.dropSendLocked()
	c.releaseRecvLocked()
	c.maybeFinishLocked()
	c.wake()
}

// finLocked consumes the peer's FIN: our receiving leg ends (the local count
// drops), and we answer with our own FIN unless we sent it already.
func (c *Conn) finLocked() {
	c.finRcvd = true
	c.releaseRecvLocked()
	c.wake()
	if !c.closing {
		e := c.e
		e.spawn(func() {
			ctx, cancel := context.WithTimeout(e.ctx, e.cfg.HandshakeTimeout)
			defer cancel()
			c.close(ctx)
		})
	}
	c.maybeFinishLocked()
}

func (c *Conn) dropSendLocked() {
	c.sendDone = true
	if c.holdsRef {
		c.holdsRef = false
		u := c.up
		delete(u.legs, c)
		u.refs--
		c.e.maybeTeardownLocked(u)
	}
}

func (c *Conn) releaseRecvLocked() {
	c.e.dropEarlyLocked(c)
	if c.recvLeg == nil || c.recvReleased {
		return
	}
	c.recvReleased = true
	if c.e.recv[c.recvTag] == c {
		delete(c.e.recv, c.recvTag)
	}
	c.e.acc.Release(c.recvLeg)
}

// maybeFinishLocked forgets a connection whose legs are both gone.
func (c *Conn) maybeFinishLocked() {
	e := c.e
	if c.finished || !c.sendDone || (c.recvLeg != nil && !c.recvReleased) {
		return
	}
	c.finished = true
	delete(e.conns, c)
	if e.pending[c.sendTag] == c {
		delete(e.pending, c.sendTag)
	}
	close(c.done)
}

// checkReadyLocked completes a connection whose two legs are up.
func (c *Conn) checkReadyLocked() {
	if c.isReady || !c.sendUp || !c.recvUp || c.err != nil {
		return
	}
	if c.recvLeg.PeerIncarnation != c.peerInc {
		c.failLocked(errIncarnation)
		return
	}
	c.isReady = true
	e := c.e
	if e.pending[c.sendTag] == c {
		delete(e.pending, c.sendTag)
	}
	close(c.ready)
	if c.inbound {
		select {
		case e.acceptq <- c:
		default:
			c.failLocked(&RejectError{Addr: c.raddr.String(), Reason: RejectBusyRetry})
		}
	}
}
