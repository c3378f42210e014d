package xrc

import (
	"context"
	"errors"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/xrc/internal/wire"
)

// holdReciprocal, once armed, holds the next reciprocal VIRT_REQ (the
// acceptor's request for a dial's reverse leg) until release is closed:
// its sender is slow to make it, or it is slow to arrive.
type holdReciprocal struct {
	wrapper
	armed   atomic.Bool
	held    chan struct{} // closed when the request waits
	release chan struct{}
}

func (k *holdReciprocal) Connect(ctx context.Context, dst netip.AddrPort, ex kernel.Exchange, qpn uint32, pd []byte) (kernel.ID, error) {
	var r wire.Req
	if ex == kernel.ExchangeSIDR && wire.DecodeReq(pd, wire.TypeVirtReq, &r) == nil && r.Flags&wire.FlagReciprocal != 0 &&
		k.armed.CompareAndSwap(true, false) {
		close(k.held)
		<-k.release
	}
	return k.Kernel.Connect(ctx, dst, ex, qpn, pd)
}

// holdFIN, once armed, holds the next FIN's post until release is closed:
// the FIN waits for room in the INI's send queue, or for its uplink's
// recovery.
type holdFIN struct {
	kernel.Kernel
	armed   atomic.Bool
	held    chan struct{}
	release chan struct{}
}

func (k *holdFIN) PostSend(q kernel.QP, wrs []kernel.SendWR) error {
	if len(wrs) == 1 && len(wrs[0].Payload) > 0 && wrs[0].Payload[0] == kindFIN && k.armed.CompareAndSwap(true, false) {
		close(k.held)
		<-k.release
	}
	return k.Kernel.PostSend(q, wrs)
}

// A dial whose reverse leg comes by its own exchange, given up at its
// deadline: its FIN ends the acceptor's half, and until the FIN has gone
// the dial is not failed. The acceptor's reciprocal request that arrives
// meanwhile was accepted, and completed the acceptor's half: Accept
// returned a connection whose dialer had failed (reading EOF once the FIN
// came). It is refused now, and the acceptor's half ends with it.
func TestDialAbandonedRefusesReciprocal(t *testing.T) {
	w := newWorld(t)
	a, b, fk, rk := holdingPair(t, w, "10.0.56")
	rk.armed.Store(true)
	fk.armed.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	_, err := a.dialOnce(ctx, b.Addr(), true) // the reverse leg by its own exchange, as Dial's second attempt asks
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("dial: %v, want its deadline", err)
	}
	awaitSetup(t, rk.held, "the reciprocal request never came")
	awaitSetup(t, fk.held, "the FIN never came")
	close(rk.release) // the reciprocal request arrives while the FIN waits
	reciprocalAnswered(t, b)
	close(fk.release)
	requireNoHalfConn(t, b)
}

// The same for a dial the endpoint's Close gives up: Close sends the FIN
// of each connection not up yet before it fails it, and a reciprocal
// request that arrived meanwhile was accepted, completing the dial: Dial
// returned a connection after Close had begun (which Close then failed),
// and the acceptor's Accept returned it too.
func TestEndpointCloseRefusesReciprocal(t *testing.T) {
	w := newWorld(t)
	a, b, fk, rk := holdingPair(t, w, "10.0.57")
	rk.armed.Store(true)
	dialed := dialLater(t, a, b)
	awaitSetup(t, rk.held, "the reciprocal request never came")
	fk.armed.Store(true)
	closed := make(chan struct{})
	go func() {
		a.Close()
		close(closed)
	}()
	awaitSetup(t, fk.held, "Close sent no FIN")
	close(rk.release) // the reciprocal request arrives while Close's FIN waits
	reciprocalAnswered(t, b)
	close(fk.release)
	<-closed
	if r := <-dialed; !errors.Is(r.err, ErrClosed) {
		t.Errorf("dial ended by Close: %v (a connection: %v); want ErrClosed", r.err, r.c != nil)
	}
	if c, err := b.Accept(ctxT(t, 300*time.Millisecond)); err == nil {
		t.Errorf("Accept returned a connection from %v, whose dialer closed before it was up", c.RemoteAddr())
	}
}

// reciprocalAnswered waits until no inbound half of b waits for its reverse
// leg: b's reciprocal request was answered.
func reciprocalAnswered(t *testing.T, b *proc) {
	t.Helper()
	eventually(t, "the acceptor's reciprocal request answered", func() (bool, string) {
		b.mu.Lock()
		defer b.mu.Unlock()
		for c := range b.conns {
			if c.inbound && !c.isReady && c.err == nil {
				return false, "its half still waits for the reverse leg"
			}
		}
		return true, ""
	})
}

// dialResult is what a dial in the background returned.
type dialResult struct {
	c   *Conn
	err error
}

// dialLater starts a's dial to b (one attempt, within 5 s) in the
// background; its result comes on the channel.
func dialLater(t *testing.T, a, b *proc) <-chan dialResult {
	return dialIn(ctxT(t, 5*time.Second), a, b)
}

// dialIn is dialLater within ctx.
func dialIn(ctx context.Context, a, b *proc) <-chan dialResult {
	dialed := make(chan dialResult, 1)
	go func() {
		c, err := a.dialOnce(ctx, b.Addr(), true)
		dialed <- dialResult{c, err}
	}()
	return dialed
}

// upBothWays takes the dial dialLater made and b's Accept of it, and checks
// a message each way.
func upBothWays(t *testing.T, dialed <-chan dialResult, b *proc) (c, d *Conn) {
	t.Helper()
	c, d = dialedAccepted(t, dialed, b)
	roundTrip(t, c, d, []byte("forward"))
	roundTrip(t, d, c, []byte("reverse"))
	return c, d
}

// dialedAccepted takes the dial dialLater made, which must have succeeded,
// and b's Accept of it.
func dialedAccepted(t *testing.T, dialed <-chan dialResult, b *proc) (c, d *Conn) {
	t.Helper()
	r := <-dialed
	if r.err != nil {
		t.Fatalf("dial: %v", r.err)
	}
	d, err := b.Accept(ctxT(t, 5*time.Second))
	if err != nil {
		t.Fatalf("accept: %v", err)
	}
	return r.c, d
}

// awaitSetup waits for a held call's signal; what says which step of the
// test's set-up never came.
func awaitSetup(t *testing.T, held <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-held:
	case <-time.After(5 * time.Second):
		t.Fatal("setup: " + what)
	}
}

// requireNoHalfConn checks that b's Accept returns nothing: the dial
// failed, and its half at b must end without reaching Accept.
func requireNoHalfConn(t *testing.T, b *proc) {
	t.Helper()
	if d, err := b.Accept(ctxT(t, 300*time.Millisecond)); err == nil {
		start := time.Now()
		_, rerr := d.Recv(ctxT(t, 3*time.Second), make([]byte, 8))
		t.Fatalf("the dial failed, yet Accept returned a connection from %v, whose Recv says %v after %v", d.RemoteAddr(), rerr, time.Since(start))
	}
}

// holdingPair makes a (whose FINs fk can hold) and b (whose reciprocal
// requests rk can hold) on ip.1 and ip.2, with a connection between them
// (the uplinks both ways); neither is armed.
func holdingPair(t *testing.T, w *world, ip string) (a, b *proc, fk *holdFIN, rk *holdReciprocal) {
	fk = &holdFIN{held: make(chan struct{}), release: make(chan struct{})}
	rk = &holdReciprocal{held: make(chan struct{}), release: make(chan struct{})}
	a = w.wrappedEndpoint(ip+".1", 7000, func(k kernel.Kernel) kernel.Kernel { fk.Kernel = k; return fk })
	b = w.wrappedEndpoint(ip+".2", 7000, func(k kernel.Kernel) kernel.Kernel { rk.Kernel = k; return rk })
	pair(t, a, b)
	return a, b, fk, rk
}
