package xrc

import (
	"testing"

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
	abandonDialHoldingFIN(t, a, b, fk, rk.held, "the reverse leg's request never came")
	g.armed.Store(true) // a makes no TGT for the request: BUSY_RETRY
	close(rk.release)   // the request arrives while the FIN waits
	finishAbandonedDial(t, a, b, fk)
	if g.armed.Load() {
		t.Fatal("setup: no TGT was asked for")
	}
}
