package xrc

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// A dial given up while the acceptor's reciprocal PHYS_REQ is on its way,
// which the dialer's acceptor refuses itself (its CreateTGT fails:
// BUSY_RETRY), not for the dial's being given up: that refusal ends the
// acceptor's half as much as the one TestDialAbandonedFINBeforeRefusal
// holds, letting the forward leg go, the last on its TGT, and the FIN,
// still to go, found no TGT: the dialer's uplink recovered with no fault.
func TestDialAbandonedFINBeforeDecidedRefusal(t *testing.T) {
	w := newWorld(t)
	fk := &holdFIN{held: make(chan struct{}), release: make(chan struct{})}
	g := &failTGT{}
	rk := &holdConnect{held: make(chan struct{}), release: make(chan struct{})}
	a := w.wrappedEndpoint("10.0.158.1", 7000, func(k kernel.Kernel) kernel.Kernel { g.Kernel = k; fk.Kernel = g; return fk })
	b := w.wrappedEndpoint("10.0.158.2", 7000, func(k kernel.Kernel) kernel.Kernel { rk.Kernel = k; return rk })
	rk.armed.Store(true) // b's only Connect: its reverse leg's request
	fk.armed.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dialed := make(chan error, 1)
	go func() {
		_, err := a.dialOnce(ctx, b.Addr(), true)
		dialed <- err
	}()
	awaitSetup(t, rk.held, "the reverse leg's request never came")
	eventually(t, "the dial's forward leg up", func() (bool, string) {
		a.mu.Lock()
		defer a.mu.Unlock()
		for _, c := range a.pending {
			if c.sendUp {
				return true, ""
			}
		}
		return false, "not yet"
	})
	cancel()
	if err := <-dialed; !errors.Is(err, context.Canceled) {
		t.Fatalf("dial: %v, want context.Canceled", err)
	}
	awaitSetup(t, fk.held, "the abandoned dial sent no FIN")
	g.armed.Store(true) // a makes no TGT for the request: BUSY_RETRY
	close(rk.release)   // the request arrives while the FIN waits
	// As in TestDialAbandonedFINBeforeRefusal: wait a while for b's half
	// to end (well within b's idle timeout), then let the FIN go.
	for deadline := time.Now().Add(testIdle / 4); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		b.mu.Lock()
		n := len(b.conns)
		b.mu.Unlock()
		if n == 0 {
			break
		}
	}
	close(fk.release)
	eventually(t, "a's dial ended", func() (bool, string) {
		a.mu.Lock()
		defer a.mu.Unlock()
		return len(a.conns) == 0 && len(a.pending) == 0, "still there"
	})
	if g.armed.Load() {
		t.Fatal("setup: no TGT was asked for")
	}
	requireNoHalfConn(t, b)
	if s := a.Stats(); s.Recoveries != 0 {
		t.Fatalf("a's uplink recovered with no fault: %+v", s)
	}
}
