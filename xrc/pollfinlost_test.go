package xrc

import (
	"context"
	"errors"
	"io"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// finInSRQ sets up two connections from a to b, x and y, with x's leg
// sorting first (the one a recovery's PHYS_REQ moves when every leg is
// alike), and b's receive loop held (h): what a sends from now on waits,
// delivered, in b's SRQ. q is a's INI, every send on it polled.
func finInSRQ(t *testing.T, a, b *proc, h *holdPolls) (x, dx, y, dy *Conn, q kernel.QP) {
	t.Helper()
	x, dx = pair(t, a, b)
	y, dy = pair(t, a, b)
	a.mu.Lock()
	if x.sendTag > y.sendTag {
		x, y, dx, dy = y, x, dy, dx
	}
	a.mu.Unlock()
	h.hold.Store(true)
	// b's receive loop holds its next poll: a poll under way, begun
	// before the hold, ends with this message (which dy reads once the
	// loop is let go: recvBeforeHold).
	if err := y.Send(ctxT(t, 5*time.Second), []byte(beforeHold)); err != nil {
		t.Fatal(err)
	}
	awaitSetup(t, h.holding, "b's receive loop never held")
	eventually(t, "a's uplink up, every send polled", func() (bool, string) {
		a.mu.Lock()
		defer a.mu.Unlock()
		u := a.uplinks[0]
		q = u.cur.qp
		return u.state == upUp && !u.settling && len(u.cur.waiters) == 0, ""
	})
	return x, dx, y, dy, q
}

// beforeHold is the message that makes b's receive loop poll again, and
// so hold its poll (holdPolls).
const beforeHold = "before the hold"

// recvBeforeHold reads beforeHold on c, once the receive loop is let go.
func recvBeforeHold(t *testing.T, c *Conn) {
	t.Helper()
	buf := make([]byte, 64)
	if n, err := c.Recv(ctxT(t, 5*time.Second), buf); err != nil || string(buf[:n]) != beforeHold {
		t.Fatalf("recv: %q, %v; want %q", buf[:n], err, beforeHold)
	}
}

// A leg's full FIN posted and delivered (it waits in the receiver's SRQ,
// whose receive loop is slow), its completion lost with a failed send
// poll, and the recovery that follows moving the leg with the PHYS_REQ; a
// second, separate one-off poll failure comes while another leg's MOVE is
// slow: the peer of the closed leg reads io.EOF, the second recovery spares
// the other, live, connection, which carries messages both ways, and the
// closed leg's Close returns nil. It guards against that second failure
// being taken for a poll that always fails (errSendPoll) and failing the
// live connection, because a FIN that went to PostSend (finPosted) kept
// even the frame that proves the new INI's poll from going: the case
// TestClosingLegSendPollFailsTwiceApart left open.
func TestPostedFINLostSendPollFailsTwiceApart(t *testing.T) {
	w := newWorld(t)
	p := &idlePollFail{waiting: map[kernel.QP]context.CancelFunc{}, fail: map[kernel.QP]bool{}}
	a := w.wrappedEndpoint("10.0.99.21", 7000, func(k kernel.Kernel) kernel.Kernel { p.Kernel = k; return p }, longTimers)
	g := &holdMoves{held: make(chan struct{}, 2), release: make(chan struct{})}
	h := &holdPolls{holding: make(chan struct{}), release: make(chan struct{})}
	b := w.wrappedEndpoint("10.0.99.22", 7000, func(k kernel.Kernel) kernel.Kernel { h.Kernel = k; g.Kernel = h; return g }, longTimers)
	var once sync.Once
	releaseRecv := func() { once.Do(func() { close(h.release) }) }
	t.Cleanup(func() { close(g.release) })
	t.Cleanup(releaseRecv)
	x, dx, y, dy, q := finInSRQ(t, a, b, h)
	defer dx.Close()
	defer dy.Close()
	defer y.Close()
	g.armed.Store(2)    // both MOVEs' answers wait
	p.armed.Store(true) // the next poll that takes completions, x's FIN's, fails
	closed := make(chan error, 1)
	go func() { closed <- x.Close() }()
	awaitSetup(t, g.held, "x's MOVE never came")
	a.mu.Lock()
	posted, recoveries := x.finPosted, a.recoveries.Load()
	a.mu.Unlock()
	if !posted || recoveries != 1 {
		t.Fatalf("setup: x's FIN posted %v, %d recoveries; want its FIN posted, 1", posted, recoveries)
	}
	g.release <- struct{}{} // x moved (b holds its leg: the FIN waits in its SRQ), the new INI made
	awaitSetup(t, g.held, "y's MOVE never came")
	failNewINIWhileMoveSlow(t, a, p, q, "y")
	// b takes x's FIN (and lets x's leg go) before the next round's MOVEs.
	releaseRecv()
	if _, err := dx.Recv(ctxT(t, 5*time.Second), make([]byte, 64)); !errors.Is(err, io.EOF) {
		t.Fatalf("dx after x's FIN: %v, want io.EOF", err)
	}
	recvBeforeHold(t, dy)
	g.release <- struct{}{} // y moved
	requireSecondRecoverySpares(t, a, y)
	roundTrip(t, y, dy, []byte("forward"))
	roundTrip(t, dy, y, []byte("reverse"))
	if err := awaitClose(t, "x", closed); err != nil {
		t.Fatalf("close: %v", err)
	}
}

// failPhysTo, once armed, fails the next XRC-typed Connect (a PHYS_REQ) to
// dst as one its receiver let time out.
type failPhysTo struct {
	kernel.Kernel
	dst   netip.AddrPort
	armed atomic.Bool
}

func (k *failPhysTo) Connect(ctx context.Context, dst netip.AddrPort, ex kernel.Exchange, qpn uint32, pd []byte) (kernel.ID, error) {
	if ex == kernel.ExchangeXRC && dst == k.dst && k.armed.CompareAndSwap(true, false) {
		var none kernel.ID
		return none, context.DeadlineExceeded
	}
	return k.Kernel.Connect(ctx, dst, ex, qpn, pd)
}

// The same where the leg whose FIN went makes the new INI because the legs
// before it could not: their receiver (another process of the node) let
// the first one's PHYS_REQ time out, so its other leg, y2, waits for a
// VIRT_REQ, which it answers slowly. A second one-off poll failure then
// spares y2, which carries messages both ways, and the closed leg's Close
// returns nil; it guards against that failure failing y2 (errSendPoll)
// because the new INI took nothing.
func TestPostedFINLostPhysLegSendPollFailsTwiceApart(t *testing.T) {
	w := newWorld(t)
	p := &idlePollFail{waiting: map[kernel.QP]context.CancelFunc{}, fail: map[kernel.QP]bool{}}
	fp := &failPhysTo{dst: netip.MustParseAddrPort("10.0.99.26:7001")}
	a := w.wrappedEndpoint("10.0.99.25", 7000, func(k kernel.Kernel) kernel.Kernel { fp.Kernel = k; p.Kernel = fp; return p }, longTimers)
	h := &holdPolls{holding: make(chan struct{}), release: make(chan struct{})}
	b := w.wrappedEndpoint("10.0.99.26", 7000, func(k kernel.Kernel) kernel.Kernel { h.Kernel = k; return h }, longTimers)
	g := &holdMoves{held: make(chan struct{}, 1), release: make(chan struct{})}
	b2 := w.wrappedEndpoint("10.0.99.26", 7001, func(k kernel.Kernel) kernel.Kernel { g.Kernel = k; return g }, longTimers)
	var once sync.Once
	releaseRecv := func() { once.Do(func() { close(h.release) }) }
	t.Cleanup(func() { close(g.release) })
	t.Cleanup(releaseRecv)
	a.mu.Lock()
	a.tags.first = []uint32{10, 20, 30} // y1, y2, then x: x's leg sorts last
	a.mu.Unlock()
	y1, d1 := pair(t, a, b2)
	y2, d2 := pair(t, a, b2)
	x, dx := pair(t, a, b)
	defer d1.Close()
	defer d2.Close()
	defer dx.Close()
	defer y2.Close()
	defer y1.Close()
	h.hold.Store(true)
	if err := x.Send(ctxT(t, 5*time.Second), []byte(beforeHold)); err != nil {
		t.Fatal(err)
	}
	awaitSetup(t, h.holding, "b's receive loop never held")
	var q kernel.QP
	eventually(t, "a's uplink up, every send polled", func() (bool, string) {
		a.mu.Lock()
		defer a.mu.Unlock()
		u := a.uplinks[0]
		q = u.cur.qp
		return len(a.uplinks) == 1 && u.state == upUp && !u.settling && len(u.cur.waiters) == 0, ""
	})
	g.armed.Store(1)     // y2's MOVE's answer waits
	fp.armed.Store(true) // y1's PHYS_REQ goes unanswered
	p.armed.Store(true)  // the next poll that takes completions, x's FIN's, fails
	closed := make(chan error, 1)
	go func() { closed <- x.Close() }()
	awaitSetup(t, g.held, "y2's MOVE never came")
	failNewINIWhileMoveSlow(t, a, p, q, "y2")
	a.mu.Lock()
	posted, y1err := x.finPosted, y1.err
	a.mu.Unlock()
	if !posted || !errors.Is(y1err, errUnanswered) {
		t.Fatalf("setup: x's FIN posted %v, y1 failed with %v; want its FIN posted, y1 unanswered", posted, y1err)
	}
	releaseRecv() // b takes x's FIN before the next round's MOVEs
	recvBeforeHold(t, dx)
	if _, err := dx.Recv(ctxT(t, 5*time.Second), make([]byte, 64)); !errors.Is(err, io.EOF) {
		t.Fatalf("dx after x's FIN: %v, want io.EOF", err)
	}
	g.release <- struct{}{} // y2 moved
	requireSecondRecoverySpares(t, a, y2)
	roundTrip(t, y2, d2, []byte("forward"))
	roundTrip(t, d2, y2, []byte("reverse"))
	if err := awaitClose(t, "x", closed); err != nil {
		t.Fatalf("close: %v", err)
	}
}
