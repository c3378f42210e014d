package xrc

import (
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
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
	// The sender's new INI and TGT, then the DREQ of the old INI, read
	// before the MOVE.
	m := dreqBeforeMove(t, r, p)
	c := m.c
	decided, release, answered := heldMove(t, r, p, virtMove(t, p, 1, m.iniQPN, m.newAcc))
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
	if err := k.PostSend(m.ini, []kernel.SendWR{{WRID: 1, RemoteSRQN: m.newAcc.SRQN, Imm: m.acc.AcceptorTag, Payload: []byte("D\x00\x00\x00\x00moved")}}); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 32)
	if n, err := c.Recv(ctxT(t, time.Second), buf); err != nil || string(buf[:n]) != "moved" {
		t.Fatalf("the moved leg's message: %q %v", buf[:n], err)
	}
}
