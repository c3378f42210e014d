package xrc

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// holdRTU, once armed, holds the next Establish (the RTU of a PHYS_REQ)
// until release is closed: an acceptor whose reciprocal PHYS_REQ has been
// answered is slow to send the RTU (the REP's flight, scheduling).
type holdRTU struct {
	wrapper
	armed   atomic.Bool
	held    chan struct{}
	release chan struct{}
}

// newHoldRTU is a holdRTU, armed, whose held RTU goes at the test's end if
// the test did not let it go.
func newHoldRTU(t *testing.T) *holdRTU {
	g := &holdRTU{held: make(chan struct{}), release: make(chan struct{})}
	t.Cleanup(func() {
		select {
		case <-g.release:
		default:
			close(g.release)
		}
	})
	g.armed.Store(true)
	return g
}

func (k *holdRTU) Establish(id kernel.ID) error {
	if k.armed.CompareAndSwap(true, false) {
		close(k.held)
		<-k.release
	}
	return k.Kernel.Establish(id)
}

// A first-contact dial (its reverse leg comes by the acceptor's reciprocal
// PHYS_REQ) whose deadline passes after the dialer answered that request
// and before the acceptor's RTU came. The dialer gives the dial up (its
// FIN goes on the forward leg), and the acceptor's half must end with it.
// The dialer's first frame went as soon as its ACCEPT was read, before the
// dial was up: the FIN was no first frame, the acceptor took it for a
// close, and once its RTU went its half completed. Accept returned a
// connection whose Dial had failed (reading io.EOF at once), 3 runs in 3.
// The first frame now waits for the reverse leg to be up, and the FIN is
// the first frame.
func TestDialGivenUpAsReciprocalIsAnsweredLeavesNoHalfConn(t *testing.T) {
	w := newWorld(t)
	a := w.endpoint("10.0.97.1", 7000)
	g := newHoldRTU(t) // b dials nothing but its reciprocal request
	b := w.wrappedEndpoint("10.0.97.2", 7000, func(k kernel.Kernel) kernel.Kernel { g.Kernel = k; return g })
	// The dial's deadline, as the RTU is on its way.
	dialCancelledAt(t, a, b, g.held, "the acceptor sent no RTU")
	close(g.release)
	requireNoHalfConn(t, b)
	requireReleased(t, w, a, b)
}

// A dial whose acceptor is slow to ask for the reverse leg, past its idle
// timeout: the dialer's first frame waits for the reverse leg, and its
// keepalives meanwhile (credit frames, which are no first frame) must keep
// the acceptor's half from its idle timeout. (Passes before the fix, whose
// first frame went at once; a fix holding back every frame until the
// reverse leg is up fails it.)
func TestReciprocalSlowerThanIdleTimeout(t *testing.T) {
	w := newWorld(t)
	a, b, _, rk := holdingPair(t, w, "10.0.98")
	rk.armed.Store(true)
	dialed := dialLater(t, a, b)
	awaitSetup(t, rk.held, "the reciprocal request never came")
	time.Sleep(testIdle + 10*testHeartbeat) // the request's slowness: past the idle timeout
	close(rk.release)
	c, d := upBothWays(t, dialed, b)
	c.Close()
	d.Close()
}

// holdAccept, once armed, holds the next Accept (a dialer's answer to the
// acceptor's reciprocal request) until release is closed: the dialer has
// taken the leg, and its ACCEPT is on its way.
type holdAccept struct {
	wrapper
	armed   atomic.Bool
	held    chan struct{}
	release chan struct{}
}

func (k *holdAccept) Accept(id kernel.ID, qpn uint32, pd []byte) error {
	if k.armed.CompareAndSwap(true, false) {
		close(k.held)
		<-k.release
	}
	return k.Kernel.Accept(id, qpn, pd)
}

// The same over live uplinks both ways: the dial's context ends as the
// dialer answers the reciprocal VIRT_REQ, after it took the leg and before
// the leg is up here. Accept returned the connection, 3 runs in 3.
func TestDialGivenUpAsReciprocalIsTakenLeavesNoHalfConn(t *testing.T) {
	w := newWorld(t)
	g := &holdAccept{held: make(chan struct{}), release: make(chan struct{})}
	a := w.wrappedEndpoint("10.0.97.3", 7000, func(k kernel.Kernel) kernel.Kernel { g.Kernel = k; return g })
	b := w.endpoint("10.0.97.4", 7000)
	t.Cleanup(func() {
		select {
		case <-g.release:
		default:
			close(g.release)
		}
	})
	c0, d0 := pair(t, a, b)
	g.armed.Store(true)
	dialCancelledAt(t, a, b, g.held, "the reciprocal request never came")
	close(g.release)
	requireNoHalfConn(t, b)
	c0.Close()
	d0.Close()
	requireReleased(t, w, a, b)
}

// dialCancelledAt dials b from a with the reverse leg by its own exchange,
// cancels the dial's context once held is closed, and checks the dial
// fails with it.
func dialCancelledAt(t *testing.T, a, b *proc, held <-chan struct{}, what string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	dialed := make(chan error, 1)
	go func() {
		c, err := a.dialOnce(ctx, b.Addr(), true)
		if c != nil {
			c.Close()
		}
		dialed <- err
	}()
	awaitSetup(t, held, what)
	cancel()
	if err := <-dialed; !errors.Is(err, context.Canceled) {
		t.Fatalf("dial: %v, want its context's end", err)
	}
}
