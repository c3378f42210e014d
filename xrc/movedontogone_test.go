package xrc

import (
	"net/netip"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/verbs"
	"github.com/goxrc/goxrc/xrc/internal/wire"
)

// physLink is physLeg keeping the CM id (its Disconnect is the DREQ) and
// the INI's number.
func physLink(t *testing.T, p *rawPeer, to netip.AddrPort, tag uint32) (kernel.QP, uint32, kernel.ID, wire.Accept) {
	t.Helper()
	k := p.k
	ini, iniQPN, err := k.CreateINI()
	if err != nil {
		t.Fatal(err)
	}
	b := encodeReq(t, wire.Req{Type: wire.TypePhysReq, ConnTag: tag, Incarnation: p.inc, INIQPN: iniQPN,
		SRQN: p.srqn, ReplyPort: p.addr.Port(), Credits: 8, MaxMessage: MaxMessageSize})
	id, err := k.Connect(ctxT(t, time.Second), to, kernel.ExchangeXRC, iniQPN, b)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := k.Event(ctxT(t, time.Second), id)
	var acc wire.Accept
	if err != nil || ev.Type != kernel.EventConnectResponse || wire.DecodeAccept(ev.PrivateData, &acc) != nil {
		t.Fatalf("PHYS_REQ tag %d: %v %v", tag, ev.Type, err)
	}
	if err := k.TransitionQP(ini, verbs.QPStateRTS, id); err != nil {
		t.Fatal(err)
	}
	if err := k.Establish(id); err != nil {
		t.Fatal(err)
	}
	sendFirstFrame(t, p, ini, acc)
	return ini, iniQPN, id, acc
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
			_, _, id1, _ := physLink(t, p, r.Addr(), 1)
			c, err := r.Accept(ctxT(t, 2*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			// A link of the sender's that stays up, for a message that
			// drains the SRQ after the DREQ (which the DREQ's rule
			// waits for).
			ini3, _, _, acc3 := physLink(t, p, r.Addr(), 3)
			if _, err := r.Accept(ctxT(t, 2*time.Second)); err != nil {
				t.Fatal(err)
			}
			// The sender's new INI and TGT (a leg of its own on them).
			_, iniQPN2, id2, acc2 := physLink(t, p, r.Addr(), 2)
			if _, err := r.Accept(ctxT(t, 2*time.Second)); err != nil {
				t.Fatal(err)
			}
			if oldGone {
				k.Disconnect(id1)
				eventually(t, "the old link's DREQ read", func() (bool, string) {
					r.mu.Lock()
					defer r.mu.Unlock()
					return !c.goneAt.IsZero(), "goneAt not set"
				})
			}
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
				INIQPN: iniQPN2, TGTQPNHint: acc2.TGTQPN, DomainHint: acc2.DomainID, SRQN: p.srqn, ReplyPort: p.addr.Port(),
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
