package model

import (
	"sync"
	"testing"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/verbs"
)

// Rule: the sender's death sends the DREQ of its XRC_SEND id: the TGT side
// (the creator's id) sees DISCONNECTED, and the TGT lives on for its holders.
func TestModelSenderDeathDREQsTGTSide(t *testing.T) {
	_, a, b := twoNodes(t, ReuseNever)
	sa, sb := newSide(t, a, domainFile(t)), newSide(t, b, domainFile(t))
	k := physLink(t, sa, sb, listen(t, sb.p, kernel.ExchangeXRC))
	sa.p.Kill()
	event(t, sb.p, k.pid, kernel.EventDisconnected)
	if b.TGTHandles(k.tgtQPN) != 1 {
		t.Fatal("TGT died with the sender")
	}
	ok(t, sb.p.Disconnect(k.pid))
	event(t, sb.p, k.pid, kernel.EventTimewaitExit)
}

// Many senders and receivers at once, for the race detector: every message
// arrives once, in order per INI.
func TestModelConcurrentTraffic(t *testing.T) {
	_, a, b := twoNodes(t, ReuseLIFO)
	path := domainFile(t)
	sb := newSide(t, b, path)
	l := listen(t, sb.p, kernel.ExchangeXRC)
	const senders, msgs = 8, 200
	links := make([]link, senders)
	sides := make([]*side, senders)
	for i := range links {
		sides[i] = newSide(t, a, domainFile(t))
		links[i] = physLink(t, sides[i], sb, l)
	}
	var wg sync.WaitGroup
	for i := range links {
		wg.Go(func() {
			p, k := sides[i].p, links[i]
			for m := 0; m < msgs; m++ {
				if err := p.PostSend(k.ini, []kernel.SendWR{{WRID: uint64(m), RemoteSRQN: sb.srqn, Imm: uint32(i<<16 | m)}}); err != nil {
					t.Error(err)
					return
				}
			}
			var c [16]kernel.SendCompletion
			for got := 0; got < msgs; {
				n, err := p.PollSend(ctxT(t), k.ini, c[:])
				if err != nil {
					t.Error(err)
					return
				}
				for _, x := range c[:n] {
					if x.Status != verbs.WCSuccess {
						t.Error(x.Status)
					}
				}
				got += n
			}
		})
	}
	next := make([]int, senders)
	var c [32]kernel.RecvCompletion
	for got := 0; got < senders*msgs; {
		n, err := sb.p.PollRecv(ctxT(t), sb.srq, c[:])
		if err != nil {
			t.Fatal(err)
		}
		for _, x := range c[:n] {
			i, m := int(x.Imm>>16), int(x.Imm&0xFFFF)
			if m != next[i] || x.TGTQPN != links[i].tgtQPN {
				t.Fatalf("sender %d: message %d via %#x, want %d via %#x", i, m, x.TGTQPN, next[i], links[i].tgtQPN)
			}
			next[i]++
		}
		got += n
	}
	wg.Wait()
}
