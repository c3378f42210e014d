package xrc

import (
	"testing"
	"time"

	"github.com/goxrc/goxrc/xrc/internal/wire"
)

// A PHYS_REQ MOVE of the generation the leg already has is the same MOVE
// once more (the sender's CM sends its REQ again when its stale table
// refused our REP; a sender numbers every new request past the last), so
// its first copy was the sender's word, and this one is none. Each copy
// makes a new TGT and so really moves the leg, and each was taken for a
// sign of life: a copy replayed every half idle timeout kept a dead
// sender's leg for ever, as 48c331f found for the MOVE onto the leg's own
// TGT. Here the copy comes from another INI of the sender's node.
func TestSameGenPhysMoveIsNoSignOfLife(t *testing.T) {
	w := newWorld(t)
	r := w.endpoint("10.0.219.10", 7001, longTimers)
	p := w.rawPeer("10.0.219.9", 7100)
	physLeg(t, p, r.Addr(), 1, 0)
	c, err := r.Accept(ctxT(t, 2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	// The sender's recovery: a PHYS_REQ MOVE of generation 1, its word.
	old := backdateIdle(r, c)
	_, acc1 := physLeg(t, p, r.Addr(), 1, wire.FlagMove)
	awaitIdleRestarted(t, r, c, old, "setup: the MOVE restarted the idle clock")
	// The same MOVE again: the leg goes onto its new TGT, but the clock
	// stays where it was.
	old = backdateIdle(r, c)
	_, acc2 := physLeg(t, p, r.Addr(), 1, wire.FlagMove)
	// The listener answers one request after another, and this one only
	// once it is done with the copy (legMoved comes after its answer).
	physLeg(t, p, r.Addr(), 2, 0)
	r.mu.Lock()
	leg := c.recvLeg
	r.mu.Unlock()
	if tgt, _ := r.acc.LegTGT(leg); acc2.TGTQPN == acc1.TGTQPN || tgt != acc2.TGTQPN {
		t.Fatalf("setup: the copy left the leg on %#x (first copy's TGT %#x, this one's %#x)", tgt, acc1.TGTQPN, acc2.TGTQPN)
	}
	if idleRestarted(r, c, old) {
		t.Fatal("a PHYS_REQ MOVE of the leg's generation, asked again, restarted the idle clock")
	}
}
