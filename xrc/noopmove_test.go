package xrc

import (
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// A MOVE onto the TGT the leg is on changes nothing (docs/xrc-protocol.md's
// decision table), so it is no sign of its sender's life either. It was
// taken for one: it cleared the DREQ's word that the sender's INI is gone
// and restarted the idle clock (3d63ef5), and since it leaves the leg's
// generation as it was, the same request is taken again and again: a
// replay of it, or a peer on the sender's node that knows the leg's
// numbers, kept a dead sender's leg, and its TGT registration, for ever.
func TestNoOpMoveIsNoSignOfLife(t *testing.T) {
	w := newWorld(t)
	r := w.endpoint("10.0.219.2", 7001, longTimers)
	p := w.rawPeer("10.0.219.1", 7100)
	k := p.k
	_, iniQPN, id, acc := physLink(t, p, r.Addr(), 1, 0)
	c, err := r.Accept(ctxT(t, 2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	// The sender's INI goes: its DREQ marks the leg's sender gone.
	k.Disconnect(id)
	awaitGoneMark(t, r, c)
	old := backdateIdle(r, c)
	// The MOVE of the leg onto its own TGT, then the same request again.
	mv := virtMove(t, p, 1, iniQPN, acc)
	for i := range 2 {
		if ev := answer(t, k, r.Addr(), kernel.ExchangeSIDR, 0, mv); ev.Type != kernel.EventEstablished {
			t.Fatalf("MOVE %d onto the leg's own TGT answered %v, want the ACCEPT that changes nothing", i, ev.Type)
		}
	}
	r.mu.Lock()
	gone := c.goneAt
	r.mu.Unlock()
	if restarted := idleRestarted(r, c, old); gone.IsZero() || restarted {
		t.Fatalf("after MOVEs onto the leg's own TGT: sender gone since the DREQ %v, idle clock restarted %v; want true, false",
			!gone.IsZero(), restarted)
	}
}

// The MOVE that moved the leg is its sender's word, whether or not our
// answer went: its sender, not answered, asks again naming the TGT the leg
// is on by then, a MOVE that changes nothing and is no sign of life.
// Counted only where our answer went, the leg was ended by the DREQ of the
// INI it left, its sender alive.
func TestMoveAskedAgainAfterFailedAnswerKeepsLeg(t *testing.T) {
	w := newWorld(t)
	fa := &failingAccept{}
	r := w.wrappedEndpoint("10.0.219.4", 7001, func(k kernel.Kernel) kernel.Kernel { fa.Kernel = k; return fa }, longTimers)
	p := w.rawPeer("10.0.219.3", 7100)
	k := p.k
	// The sender's new INI and TGT, then the DREQ of the old INI, read
	// before the MOVE.
	m := dreqBeforeMove(t, r, p)
	c := m.c
	move := func(gen uint32) kernel.Event {
		id, err := k.Connect(ctxT(t, time.Second), r.Addr(), kernel.ExchangeSIDR, 0, virtMove(t, p, gen, m.iniQPN, m.newAcc))
		if err != nil {
			t.Fatal(err)
		}
		defer k.DestroyID(id)
		ev, _ := k.Event(ctxT(t, time.Second), id)
		return ev
	}
	fa.armed.Store(true) // our answer to the MOVE fails
	move(1)
	fa.armed.Store(false)
	r.mu.Lock()
	leg := c.recvLeg
	r.mu.Unlock()
	if tgt, _ := r.acc.LegTGT(leg); tgt != m.newAcc.TGTQPN {
		t.Fatalf("setup: the MOVE left the leg on %#x, want %#x", tgt, m.newAcc.TGTQPN)
	}
	if ev := move(2); ev.Type != kernel.EventEstablished {
		t.Fatalf("the MOVE asked again answered %v, want its ACCEPT", ev.Type)
	}
	r.mu.Lock()
	gone := !c.goneAt.IsZero()
	r.mu.Unlock()
	if gone {
		t.Fatal("the leg its live sender moved is still marked gone by the DREQ of the INI it left")
	}
}
