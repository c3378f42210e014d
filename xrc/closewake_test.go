package xrc

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// recvStall holds back the SRQ's completions while hold is set: the
// process is alive (its janitor sends keepalives) but does not read its SRQ.
type recvStall struct {
	kernel.Kernel
	mu   sync.Mutex
	hold chan struct{}
}

func (g *recvStall) PollRecv(ctx context.Context, s kernel.SRQ, out []kernel.RecvCompletion) (int, error) {
	g.mu.Lock()
	h := g.hold
	g.mu.Unlock()
	if h != nil {
		select {
		case <-h:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return g.Kernel.PollRecv(ctx, s, out)
}

func (g *recvStall) wrap(k kernel.Kernel) kernel.Kernel { g.Kernel = k; return g }

func (g *recvStall) set(h chan struct{}) { g.mu.Lock(); g.hold = h; g.mu.Unlock() }

// A Send blocked on credits must fail with ErrClosed when its connection is
// closed, whether or not the peer answers the FIN at once.
func TestConnCloseWakesCreditWaitStalledPeer(t *testing.T) {
	w := newWorld(t)
	stall := &recvStall{}
	b := w.wrappedEndpoint("10.0.0.2", 7000, stall.wrap, func(c *Config) { c.RecvWindow = 1 })
	ca, _ := pair(t, w.endpoint("10.0.0.1", 7000), b)
	ctx := ctxT(t, 3*time.Second)
	if err := ca.Send(ctx, []byte("x")); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	defer close(release)
	stall.set(release) // the peer stops reading its SRQ (slow, descheduled)
	errc := make(chan error, 1)
	go func() { errc <- ca.Send(ctx, []byte("y")) }() // no credit left
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	if err := ca.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("Close returned after %v", time.Since(start))
	select {
	case err := <-errc:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("blocked send after Close: %v, want ErrClosed", err)
		}
		t.Logf("send woke after %v", time.Since(start))
	case <-time.After(time.Second):
		t.Fatalf("Send blocked on credits still waiting 1s after Close returned")
	}
}

// Accept on a closed endpoint must fail with ErrClosed, not hand out a
// connection that was queued (and that Close has already failed).
func TestEndpointAcceptAfterClose(t *testing.T) {
	w := newWorld(t)
	a, b := w.endpoint("10.0.0.1", 7000), w.endpoint("10.0.0.2", 7000)
	for i := range 4 {
		if _, err := a.Dial(ctxT(t, 5*time.Second), b.Addr().String()); err != nil {
			t.Fatal(err)
		}
		_ = i
	}
	eventually(t, "queued", func() (bool, string) { return len(b.acceptq) == 4, "" })
	b.Close()
	got := 0
	for range 4 {
		c, err := b.Accept(ctxT(t, time.Second))
		if err == nil {
			got++
			_, rerr := c.Recv(ctxT(t, time.Second), make([]byte, 8))
			t.Logf("Accept after Close returned a connection; its Recv: %v", rerr)
		} else if !errors.Is(err, ErrClosed) {
			t.Fatalf("Accept after Close: %v", err)
		}
	}
	if got > 0 {
		t.Fatalf("Accept after Close returned %d connections of 4 calls", got)
	}
}

// memfabric's Kill: "Engines running on it fail from then on", a blocked
// Accept too (it waited until the application called Close).
func TestEndpointAcceptAfterOwnProcessKilled(t *testing.T) {
	w := newWorld(t)
	a, b := w.endpoint("10.0.0.1", 7000), w.endpoint("10.0.0.2", 7000)
	ca, _ := pair(t, a, b)
	errc := make(chan error, 2)
	go func() { _, err := b.Accept(context.Background()); errc <- err }()
	go func() { _, err := ca.Recv(context.Background(), make([]byte, 8)); errc <- err }()
	time.Sleep(50 * time.Millisecond)
	a.p.Kill()
	b.p.Kill()
	for range 2 {
		select {
		case err := <-errc:
			if err == nil {
				t.Fatal("a blocked call on a killed process's endpoint returned no error")
			}
			t.Logf("woke: %v", err)
		case <-time.After(2 * time.Second):
			t.Fatal("a blocked call on a killed process's endpoint still waits 2 s later")
		}
	}
}
