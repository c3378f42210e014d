package xrc

import (
	"context"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// lateSIDR hands a SIDR exchange's answer over only once the caller's
// context has ended: an answer that arrives as a Dial's deadline passes.
type lateSIDR struct {
	kernel.Kernel
	armed atomic.Bool
	mu    sync.Mutex
	sidr  map[kernel.ID]bool
}

func (g *lateSIDR) Connect(ctx context.Context, dst netip.AddrPort, ex kernel.Exchange, qpn uint32, pd []byte) (kernel.ID, error) {
	id, err := g.Kernel.Connect(ctx, dst, ex, qpn, pd)
	if err == nil && ex == kernel.ExchangeSIDR && g.armed.Load() {
		g.mu.Lock()
		g.sidr[id] = true
		g.mu.Unlock()
	}
	return id, err
}

func (g *lateSIDR) Event(ctx context.Context, id kernel.ID) (kernel.Event, error) {
	g.mu.Lock()
	late := g.sidr[id]
	g.mu.Unlock()
	if !late {
		return g.Kernel.Event(ctx, id)
	}
	ev, err := g.Kernel.Event(context.Background(), id)
	<-ctx.Done()
	return ev, err
}

// A Dial whose deadline passes as its connection comes up either returns
// the connection or fails having ended the acceptor's half with a FIN. It
// could fail without one (Go's select picking the deadline over the
// connection being ready), and the acceptor's Accept then returned a
// connection whose dialer was gone, silent until the idle timeout.
func TestDialDeadlineAsItComesUpLeavesNoHalfConn(t *testing.T) {
	w := newWorld(t)
	g := &lateSIDR{sidr: map[kernel.ID]bool{}}
	a := w.wrappedEndpoint("10.0.92.1", 7000, func(k kernel.Kernel) kernel.Kernel { g.Kernel = k; return g })
	b := w.endpoint("10.0.92.2", 7000)
	pair(t, a, b) // uplinks both ways: the next dials take one exchange
	g.armed.Store(true)
	var failed, orphaned int
	for range 12 {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		c, err := a.Dial(ctx, b.Addr().String())
		cancel()
		d, aerr := b.Accept(ctxT(t, 300*time.Millisecond))
		if err == nil {
			c.Close()
			if aerr == nil {
				d.Close()
			}
			continue
		}
		failed++
		if aerr == nil {
			orphaned++
			t.Logf("dial: %v; yet Accept returned a connection", err)
			d.Close()
		}
	}
	t.Logf("%d of 12 dials failed", failed)
	if orphaned > 0 {
		t.Fatalf("%d failed dials left the acceptor a connection without a FIN", orphaned)
	}
}
