package xrc

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// An acceptor's half whose reverse leg failed to open can never reach
// Accept: it gives its place in the Accept backlog back before its ABORT
// goes, not once the ABORT is answered. It held it meanwhile, up to a
// handshake timeout where the ABORT went unanswered, and with the backlog
// otherwise full a dial that would fit was refused BUSY_RETRY.
func TestReverseAbortGivesBacklogSlotBack(t *testing.T) {
	w := newWorld(t)
	k := &holdAbort{held: make(chan struct{}), release: make(chan struct{})}
	b := w.wrappedEndpoint("10.0.107.2", 7000, func(kk kernel.Kernel) kernel.Kernel { k.Kernel = kk; return k })
	a := w.endpoint("10.0.107.1", 7000)
	var conns []*Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	// The backlog full but for one place; b's uplink to a's node is
	// made on the first.
	for i := range acceptBacklog - 1 {
		c, err := a.Dial(ctxT(t, 5*time.Second), b.Addr().String())
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		conns = append(conns, c)
	}
	// x, on a node b has no uplink to: b makes no INI for its reverse
	// leg, and its ABORT is held.
	k.armed.Store(true)
	x := w.endpoint("10.0.107.3", 7000, func(c *Config) { c.HandshakeTimeout = time.Hour })
	xerr := make(chan error, 1)
	go func() {
		c, err := x.Dial(ctxT(t, time.Minute), b.Addr().String())
		if err == nil {
			c.Close()
		}
		xerr <- err
	}()
	awaitSetup(t, k.held, "b sent no ABORT")
	// b's reverse leg to a's node rides its uplink there: no INI.
	c, err := a.Dial(ctxT(t, 5*time.Second), b.Addr().String())
	if err != nil {
		close(k.release)
		<-xerr
		t.Fatalf("a dial to b while its failed half's ABORT was under way: %v, want the last place in the backlog", err)
	}
	conns = append(conns, c)
	close(k.release)
	if err := <-xerr; !errors.Is(err, errReverseAborted) {
		t.Fatalf("x's dial failed with %v; want the acceptor's ABORT", err)
	}
	k.armed.Store(false)
	for range acceptBacklog {
		d, err := b.Accept(ctxT(t, 5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		d.Close()
	}
	if d, err := b.Accept(ctxT(t, 300*time.Millisecond)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Accept returned %v, %v: the half whose dial failed", d, err)
	}
	for _, c := range conns {
		c.Close()
	}
	requireNoLeftovers(t, a, b, x)
}
