package xrc

import (
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/verbs"
	"github.com/goxrc/goxrc/xrc/internal/wire"
)

// The DREQ of the INI a leg left ends the leg only while it is still on
// that link. A MOVE decided after the DREQ was read took the leg off it,
// but the mark stayed until onRequest's legMoved, after the kernel's Accept
// of our answer: a janitor pass in between took the live sender, whose
// MOVE we had just taken, for dead. Here the pass comes while the decision
// is held (testAfterDecide); the SRQ drains meanwhile (the old TGT's handle
// lingers for it), which the DREQ's rule waits for.
func TestMoveDecidedAfterDREQKeepsLeg(t *testing.T) {
	w := newWorld(t)
	r := w.endpoint("10.0.219.6", 7001, func(c *Config) { c.IdleTimeout = time.Hour }) // no idle verdict in the test
	p := w.rawPeer("10.0.219.5", 7100)
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
	decided, release := make(chan struct{}), make(chan struct{})
	hook := func(d decision) {
		if d.Moved {
			close(decided)
			<-release
		}
	}
	r.testAfterDecide.Store(&hook)
	answered := make(chan kernel.Event, 1)
	mv := encodeReq(t, wire.Req{Type: wire.TypeVirtReq, Flags: wire.FlagMove, Move: 1, ConnTag: 1, Incarnation: p.inc,
		INIQPN: info.Num, TGTQPNHint: acc2.TGTQPN, DomainHint: acc2.DomainID, SRQN: p.srqn, ReplyPort: p.addr.Port(),
		Credits: 8, MaxMessage: MaxMessageSize})
	go func() {
		id, err := k.Connect(ctxT(t, 5*time.Second), r.Addr(), kernel.ExchangeSIDR, 0, mv)
		if err != nil {
			answered <- kernel.Event{}
			return
		}
		defer k.DestroyID(id)
		ev, _ := k.Event(ctxT(t, 5*time.Second), id)
		answered <- ev
	}()
	<-decided
	// The SRQ drains after the DREQ, and the janitor passes (every half
	// heartbeat) for some heartbeats: the leg, on its new TGT, must stay.
	eventually(t, "a drain after the DREQ", func() (bool, string) {
		r.mu.Lock()
		defer r.mu.Unlock()
		return r.drains.Load() > c.goneDrains, "no drain"
	})
	failed := func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		return c.failed()
	}
	for i := 0; i < 8 && !failed(); i++ {
		time.Sleep(r.cfg.Heartbeat)
	}
	ended := failed()
	close(release)
	if ev := <-answered; ev.Type != kernel.EventEstablished {
		t.Errorf("the MOVE answered %v, want its ACCEPT", ev.Type)
	}
	if ended {
		t.Fatalf("the leg its sender moved after the DREQ was ended while the MOVE was decided: %v", c.Err())
	}
	// The sender's data on the moved leg arrives.
	if err := k.PostSend(ini2, []kernel.SendWR{{WRID: 1, RemoteSRQN: acc2.SRQN, Imm: acc.AcceptorTag, Payload: []byte("D\x00\x00\x00\x00moved")}}); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 32)
	if n, err := c.Recv(ctxT(t, time.Second), buf); err != nil || string(buf[:n]) != "moved" {
		t.Fatalf("the moved leg's message: %q %v", buf[:n], err)
	}
}
