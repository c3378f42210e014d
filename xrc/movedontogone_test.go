package xrc

import (
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/xrc/internal/wire"
)

// virtMove encodes raw peer p's VIRT_REQ MOVE of its leg tag 1, of
// generation gen, onto the TGT acc names, through the INI iniQPN.
func virtMove(t *testing.T, p *rawPeer, gen, iniQPN uint32, acc wire.Accept) []byte {
	t.Helper()
	return encodeReq(t, wire.Req{Type: wire.TypeVirtReq, Flags: wire.FlagMove, Move: gen, ConnTag: 1, Incarnation: p.inc,
		INIQPN: iniQPN, TGTQPNHint: acc.TGTQPN, DomainHint: acc.DomainID, SRQN: p.srqn, ReplyPort: p.addr.Port(),
		Credits: 8, MaxMessage: MaxMessageSize})
}

// heldMove sends the MOVE mv from raw peer p to r and holds r's decision
// of it (testAfterDecide) until release is closed; decided is closed once
// it is made, and answered gets the CM's answer to p.
func heldMove(t *testing.T, r *proc, p *rawPeer, mv []byte) (decided, release chan struct{}, answered chan kernel.Event) {
	t.Helper()
	decided, release, answered = make(chan struct{}), make(chan struct{}), make(chan kernel.Event, 1)
	hook := func(d decision) {
		if d.Moved {
			close(decided)
			<-release
		}
	}
	r.testAfterDecide.Store(&hook)
	go func() {
		id, err := p.k.Connect(ctxT(t, 5*time.Second), r.Addr(), kernel.ExchangeSIDR, 0, mv)
		if err != nil {
			answered <- kernel.Event{}
			return
		}
		defer p.k.DestroyID(id)
		ev, _ := p.k.Event(ctxT(t, 5*time.Second), id)
		answered <- ev
	}()
	return decided, release, answered
}

// dreqBefore is where a MOVE comes after a DREQ: raw peer p's leg tag 1
// (c at the receiver, acc its ACCEPT), whose link's DREQ the receiver has
// read, and a second link of p's (tag 2, a leg of its own on it: ini, its
// number iniQPN and ACCEPT newAcc), onto which p moves leg 1.
type dreqBefore struct {
	c      *Conn
	acc    wire.Accept
	ini    kernel.QP
	iniQPN uint32
	newAcc wire.Accept
}

// dreqBeforeMove makes the links of a dreqBefore from p to r.
func dreqBeforeMove(t *testing.T, r *proc, p *rawPeer) dreqBefore {
	t.Helper()
	var m dreqBefore
	_, _, id, acc := physLink(t, p, r.Addr(), 1, 0)
	c, err := r.Accept(ctxT(t, 2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	m.c, m.acc = c, acc
	m.ini, m.iniQPN, _, m.newAcc = physLink(t, p, r.Addr(), 2, 0)
	if _, err := r.Accept(ctxT(t, 2*time.Second)); err != nil {
		t.Fatal(err)
	}
	p.k.Disconnect(id)
	awaitGoneMark(t, r, c)
	return m
}

// awaitGoneMark waits until r has read the DREQ that marks c's sender gone.
func awaitGoneMark(t *testing.T, r *proc, c *Conn) {
	t.Helper()
	eventually(t, "the DREQ read", func() (bool, string) {
		r.mu.Lock()
		defer r.mu.Unlock()
		return !c.goneAt.IsZero(), "goneAt not set"
	})
}

// The DREQ of the link a MOVE put the leg on is the word that the leg's
// sender is gone, as for a leg that never moved. Read between the MOVE's
// decision and its legMoved (here while the decision is held,
// testAfterDecide), it was wiped by legMoved, which took it for the mark of
// the link the leg left; and where the DREQ of that link had come first,
// its mark stood in the new one's way (senderGone marks a leg once). The
// dead sender's leg lived a full idle timeout.
func TestDREQOfLinkMovedOntoEndsLeg(t *testing.T) {
	for _, oldGone := range []bool{false, true} {
		name := "the old link up"
		if oldGone {
			name = "after the old link's DREQ"
		}
		t.Run(name, func(t *testing.T) {
			w := newWorld(t)
			r := w.endpoint("10.0.219.8", 7001, func(c *Config) { c.IdleTimeout = time.Hour }) // no idle verdict in the test
			p := w.rawPeer("10.0.219.7", 7100)
			k := p.k
			_, _, id1, _ := physLink(t, p, r.Addr(), 1, 0)
			c, err := r.Accept(ctxT(t, 2*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			// A link of the sender's that stays up, for a message that
			// drains the SRQ after the DREQ (which the DREQ's rule
			// waits for).
			ini3, _, _, acc3 := physLink(t, p, r.Addr(), 3, 0)
			if _, err := r.Accept(ctxT(t, 2*time.Second)); err != nil {
				t.Fatal(err)
			}
			// The sender's new INI and TGT (a leg of its own on them).
			_, iniQPN2, id2, acc2 := physLink(t, p, r.Addr(), 2, 0)
			if _, err := r.Accept(ctxT(t, 2*time.Second)); err != nil {
				t.Fatal(err)
			}
			if oldGone {
				k.Disconnect(id1)
				awaitGoneMark(t, r, c)
			}
			decided, release, answered := heldMove(t, r, p, virtMove(t, p, 1, iniQPN2, acc2))
			<-decided
			// The leg is on the new link now. The sender dies: the DREQ
			// of its new INI, read before legMoved (the new link's other
			// leg, marked by it, says it was read).
			k.Disconnect(id2)
			eventually(t, "the new link's DREQ read", func() (bool, string) {
				r.mu.Lock()
				defer r.mu.Unlock()
				for _, o := range r.recv {
					if o != c && !o.goneAt.IsZero() {
						return true, ""
					}
				}
				return false, "the new link's leg not marked"
			})
			close(release)
			if ev := <-answered; ev.Type != kernel.EventEstablished {
				t.Fatalf("the MOVE answered %v, want its ACCEPT", ev.Type)
			}
			r.mu.Lock()
			gone, on := !c.goneAt.IsZero(), c.goneLink != nil && onLink(r.acc.LegDownlink(c.recvLeg), c.goneLink)
			r.mu.Unlock()
			if !gone || !on {
				t.Fatalf("after the MOVE's answer: the leg marked gone %v, by the link it is on %v; want both", gone, on)
			}
			// The DREQ's rule waits for a poll begun after it that finds
			// the SRQ empty: a keepalive ends the poll under way, one more
			// comes in a poll begun after.
			sendFirstFrame(t, p, ini3, acc3)
			eventually(t, "a poll begun after the DREQ", func() (bool, string) {
				r.mu.Lock()
				defer r.mu.Unlock()
				return r.polls.Load() > c.goneDrains, "none"
			})
			sendFirstFrame(t, p, ini3, acc3)
			eventually(t, "the leg ended by its link's DREQ", func() (bool, string) {
				r.mu.Lock()
				defer r.mu.Unlock()
				return c.failed(), "the leg lives"
			})
		})
	}
}
