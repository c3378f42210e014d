package xrc

import (
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/verbs"
	"github.com/goxrc/goxrc/xrc/internal/wire"
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
	ini, iniQPN, err := k.CreateINI()
	if err != nil {
		t.Fatal(err)
	}
	b := encodeReq(t, wire.Req{Type: wire.TypePhysReq, ConnTag: 1, Incarnation: p.inc, INIQPN: iniQPN,
		SRQN: p.srqn, ReplyPort: p.addr.Port(), Credits: 8, MaxMessage: MaxMessageSize})
	id, err := k.Connect(ctxT(t, time.Second), r.Addr(), kernel.ExchangeXRC, iniQPN, b)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := k.Event(ctxT(t, time.Second), id)
	var acc wire.Accept
	if err != nil || ev.Type != kernel.EventConnectResponse || wire.DecodeAccept(ev.PrivateData, &acc) != nil {
		t.Fatalf("PHYS_REQ: %v %v", ev.Type, err)
	}
	if err := k.TransitionQP(ini, verbs.QPStateRTS, id); err != nil {
		t.Fatal(err)
	}
	if err := k.Establish(id); err != nil {
		t.Fatal(err)
	}
	sendFirstFrame(t, p, ini, acc)
	c, err := r.Accept(ctxT(t, 2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	// The sender's INI goes: its DREQ marks the leg's sender gone.
	k.Disconnect(id)
	eventually(t, "the DREQ read", func() (bool, string) {
		r.mu.Lock()
		defer r.mu.Unlock()
		return !c.goneAt.IsZero(), "goneAt not set"
	})
	old := time.Now().Add(-time.Minute)
	r.mu.Lock()
	c.lastSeen = old
	r.mu.Unlock()
	// The MOVE of the leg onto its own TGT, then the same request again.
	mv := encodeReq(t, wire.Req{Type: wire.TypeVirtReq, Flags: wire.FlagMove, Move: 1, ConnTag: 1, Incarnation: p.inc,
		INIQPN: iniQPN, TGTQPNHint: acc.TGTQPN, DomainHint: acc.DomainID, SRQN: p.srqn, ReplyPort: p.addr.Port(),
		Credits: 8, MaxMessage: MaxMessageSize})
	for i := range 2 {
		if ev := answer(t, k, r.Addr(), kernel.ExchangeSIDR, 0, mv); ev.Type != kernel.EventEstablished {
			t.Fatalf("MOVE %d onto the leg's own TGT answered %v, want the ACCEPT that changes nothing", i, ev.Type)
		}
	}
	r.mu.Lock()
	gone, seen := c.goneAt, c.lastSeen
	r.mu.Unlock()
	if gone.IsZero() || seen.After(old) {
		t.Fatalf("after MOVEs onto the leg's own TGT: sender gone since the DREQ %v, idle clock restarted %v; want true, false",
			!gone.IsZero(), seen.After(old))
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
	ini, iniQPN, err := k.CreateINI()
	if err != nil {
		t.Fatal(err)
	}
	b := encodeReq(t, wire.Req{Type: wire.TypePhysReq, ConnTag: 1, Incarnation: p.inc, INIQPN: iniQPN,
		SRQN: p.srqn, ReplyPort: p.addr.Port(), Credits: 8, MaxMessage: MaxMessageSize})
	id, err := k.Connect(ctxT(t, time.Second), r.Addr(), kernel.ExchangeXRC, iniQPN, b)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := k.Event(ctxT(t, time.Second), id)
	var acc wire.Accept
	if err != nil || ev.Type != kernel.EventConnectResponse || wire.DecodeAccept(ev.PrivateData, &acc) != nil {
		t.Fatalf("PHYS_REQ: %v %v", ev.Type, err)
	}
	if err := k.TransitionQP(ini, verbs.QPStateRTS, id); err != nil {
		t.Fatal(err)
	}
	if err := k.Establish(id); err != nil {
		t.Fatal(err)
	}
	sendFirstFrame(t, p, ini, acc)
	c, err := r.Accept(ctxT(t, 2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	// The sender's new INI and TGT (a leg of its own on them), then the
	// DREQ of the old INI, read before the MOVE.
	ini2, acc2 := physLeg(t, p, r.Addr(), 2, 0)
	info, err := k.QueryQP(ini2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Accept(ctxT(t, 2*time.Second)); err != nil {
		t.Fatal(err)
	}
	k.Disconnect(id)
	eventually(t, "the DREQ read", func() (bool, string) {
		r.mu.Lock()
		defer r.mu.Unlock()
		return !c.goneAt.IsZero(), "goneAt not set"
	})
	move := func(gen uint32) kernel.Event {
		mv := encodeReq(t, wire.Req{Type: wire.TypeVirtReq, Flags: wire.FlagMove, Move: gen, ConnTag: 1, Incarnation: p.inc,
			INIQPN: info.Num, TGTQPNHint: acc2.TGTQPN, DomainHint: acc2.DomainID, SRQN: p.srqn, ReplyPort: p.addr.Port(),
			Credits: 8, MaxMessage: MaxMessageSize})
		id, err := k.Connect(ctxT(t, time.Second), r.Addr(), kernel.ExchangeSIDR, 0, mv)
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
	if tgt, _ := r.acc.LegTGT(leg); tgt != acc2.TGTQPN {
		t.Fatalf("setup: the MOVE left the leg on %#x, want %#x", tgt, acc2.TGTQPN)
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
