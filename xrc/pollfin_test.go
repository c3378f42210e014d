package xrc

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// holdMoves holds the next armed answers (Accept) of its endpoint: each
// signals held, then waits for a value on release, or for release to close.
type holdMoves struct {
	wrapper
	armed   atomic.Int32
	held    chan struct{} // buffered, as many as armed
	release chan struct{}
}

func newHoldMoves(t *testing.T, n int) *holdMoves {
	k := &holdMoves{held: make(chan struct{}, n), release: make(chan struct{})}
	t.Cleanup(func() { close(k.release) })
	return k
}

func (k *holdMoves) Accept(id kernel.ID, qpn uint32, pd []byte) error {
	if n := k.armed.Load(); n > 0 && k.armed.CompareAndSwap(n, n-1) {
		k.held <- struct{}{}
		<-k.release
	}
	return k.Kernel.Accept(id, qpn, pd)
}

// Two one-off send poll failures apart on an uplink whose first leg by tag,
// the one its recovery moves with the PHYS_REQ, closes as the recovery
// runs (its FIN waits until every MOVE is answered: finHeldLocked), the
// second, idle, while another leg's MOVE is slow: the second recovery
// spares that other, live, connection, which carries messages both ways
// after it, and the closing leg's Close returns nil. It guards against the
// second failure being taken for a poll that fails on every INI
// (errSendPoll), because the closing leg's resend sent nothing after the
// FIN (finOut) and the new INI took no completion, as
// TestAwaitFirstSendPollFailsTwiceApart for a half waiting for its first
// frame.
func TestClosingLegSendPollFailsTwiceApart(t *testing.T) {
	w := newWorld(t)
	p := &idlePollFail{waiting: map[kernel.QP]context.CancelFunc{}, fail: map[kernel.QP]bool{}}
	a := w.wrappedEndpoint("10.0.99.7", 7000, func(k kernel.Kernel) kernel.Kernel { p.Kernel = k; return p }, longTimers)
	g := newHoldMoves(t, 2)
	b := w.wrappedEndpoint("10.0.99.8", 7000, func(k kernel.Kernel) kernel.Kernel { g.Kernel = k; return g }, longTimers)
	x, dx := pair(t, a, b)
	y, dy := pair(t, a, b)
	defer dx.Close()
	defer dy.Close()
	defer y.Close()
	a.mu.Lock()
	if x.sendTag > y.sendTag { // x: the leg the recovery's PHYS_REQ moves
		x, y, dx, dy = y, x, dy, dx
	}
	a.mu.Unlock()
	var q kernel.QP
	eventually(t, "a's uplink up, every send polled", func() (bool, string) {
		a.mu.Lock()
		defer a.mu.Unlock()
		u := a.uplinks[0]
		q = u.cur.qp
		return u.state == upUp && !u.settling && len(u.cur.waiters) == 0, ""
	})
	g.armed.Store(2) // both MOVEs' answers wait
	p.failIdle(q)    // the uplink's first poll failure: a recovery
	awaitSetup(t, g.held, "x's MOVE never came")
	closed := make(chan error, 1)
	go func() { closed <- x.Close() }()
	eventually(t, "x's FIN waiting for the uplink", func() (bool, string) {
		a.mu.Lock()
		defer a.mu.Unlock()
		return x.finOut, ""
	})
	failAgainWhileMoveSlow(t, a, g, p, q, y, dy)
	if err := awaitClose(t, "x", closed); err != nil {
		t.Fatalf("close: %v", err)
	}
}

// The same for a dial given up as the recovery runs (abandoned; its FIN,
// to be the acceptor's half's first frame, waits for the MOVEs): the dial
// fails, the second recovery spares the other, live, connection, which
// carries messages both ways, and the given-up dial leaves no half
// connection at the acceptor. It guards against the second, idle, poll
// failure while another leg's MOVE is slow failing that live connection
// (errSendPoll), the abandoned leg's resend having sent nothing before its
// FIN (no keepalive may).
func TestAbandonedDialSendPollFailsTwiceApart(t *testing.T) {
	w := newWorld(t)
	ha := &holdAccept{held: make(chan struct{}), release: make(chan struct{})}
	p := &idlePollFail{waiting: map[kernel.QP]context.CancelFunc{}, fail: map[kernel.QP]bool{}}
	a := w.wrappedEndpoint("10.0.99.9", 7000, func(k kernel.Kernel) kernel.Kernel { ha.Kernel = k; p.Kernel = ha; return p }, longTimers)
	g := newHoldMoves(t, 2)
	b := w.wrappedEndpoint("10.0.99.10", 7000, func(k kernel.Kernel) kernel.Kernel { g.Kernel = k; return g }, longTimers)
	t.Cleanup(func() { close(ha.release) })
	a.mu.Lock()
	a.tags.first = []uint32{1 << 31, 1} // y, then x: x's leg sorts first (the PHYS_REQ's)
	a.mu.Unlock()
	y, dy := pair(t, a, b)
	defer y.Close()
	defer dy.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ha.armed.Store(true) // x's reverse leg, by b's reciprocal request, waits: x is held
	dialed := dialIn(ctx, a, b)
	awaitSetup(t, ha.held, "the reciprocal request never came")
	var x *Conn
	var q kernel.QP
	eventually(t, "x held, its probe polled", func() (bool, string) {
		a.mu.Lock()
		defer a.mu.Unlock()
		for k := range a.conns {
			if k != y {
				x = k
			}
		}
		u := a.uplinks[0]
		q = u.cur.qp
		return x != nil && x.firstHeld && u.state == upUp && !u.settling && len(u.cur.waiters) == 0, ""
	})
	g.armed.Store(2) // both MOVEs' answers wait
	p.failIdle(q)    // the uplink's first poll failure: a recovery
	awaitSetup(t, g.held, "x's MOVE never came")
	cancel() // x given up: its FIN waits for the uplink
	if r := <-dialed; r.err == nil {
		r.c.Close()
		t.Fatal("the dial given up succeeded")
	}
	eventually(t, "x's FIN waiting for the uplink", func() (bool, string) {
		a.mu.Lock()
		defer a.mu.Unlock()
		return x.abandoned && x.finOut, ""
	})
	failAgainWhileMoveSlow(t, a, g, p, q, y, dy)
	requireNoHalfConn(t, b) // x's FIN ended its half: a probe before it is no first frame
}

// failAgainWhileMoveSlow goes on with a recovery of a's uplink (off INI q)
// whose MOVEs g holds, the first one's to be let go now: it waits until
// the uplink is up on the new INI with y's MOVE unanswered, fails that
// INI's poll once more (p), lets y's MOVE go, and requires the second
// recovery to spare y (and y and dy to talk both ways).
func failAgainWhileMoveSlow(t *testing.T, a *proc, g *holdMoves, p *idlePollFail, q kernel.QP, y, dy *Conn) {
	t.Helper()
	g.release <- struct{}{} // x moved, the new INI made
	awaitSetup(t, g.held, "y's MOVE never came")
	failNewINIWhileMoveSlow(t, a, p, q, "y")
	g.release <- struct{}{} // y moved
	requireSecondRecoverySpares(t, a, y)
	roundTrip(t, y, dy, []byte("forward"))
	roundTrip(t, dy, y, []byte("reverse"))
}

// failNewINIWhileMoveSlow waits until a's uplink is up on a new INI (not q)
// with leg's MOVE unanswered and every send polled, fails that INI's poll
// once more (p: a second one-off failure, apart from the first), and waits
// until the failure is taken.
func failNewINIWhileMoveSlow(t *testing.T, a *proc, p *idlePollFail, q kernel.QP, leg string) {
	t.Helper()
	var q1 kernel.QP
	eventually(t, "up on the new INI, "+leg+"'s MOVE unanswered, every send polled", func() (bool, string) {
		a.mu.Lock()
		defer a.mu.Unlock()
		u := a.uplinks[0]
		q1 = u.cur.qp
		return u.state == upUp && u.settling && q1 != q && len(u.cur.waiters) == 0, fmt.Sprint(u.state)
	})
	p.failIdle(q1)
	eventually(t, "the new INI's failure taken", func() (bool, string) {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.uplinks[0].state == upRecovering, ""
	})
}

// awaitClose waits for a Close run in the background to return, and
// returns its error.
func awaitClose(t *testing.T, what string, closed <-chan error) error {
	t.Helper()
	select {
	case err := <-closed:
		return err
	case <-time.After(5 * time.Second):
		t.Fatal(what + "'s Close never returned")
		return nil
	}
}
