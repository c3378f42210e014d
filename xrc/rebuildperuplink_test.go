package xrc

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// holdDREQs is holdDials that, while gate is set, also holds each DREQ
// (EventDisconnected) it reads until gate closes: the word that a TGT's
// maker let go of it comes after a dial's refusal. It lets go of the
// requests it holds one at a time, in the order they came (next), not of
// whichever waits on holdDials' release: a dial whose held the test had
// taken need not wait there yet, and where it did not, the second release
// of a round went to the other dial, held again over the next uplink,
// whose TGT lives. p took its leg and opened the reverse one, a PHYS_REQ to
// s, while the gate held the DREQ of r's INI: its node's CM still had r's
// link in its stale table, and refused each REP naming the TGT number that
// s freed and made again, until the dial failed at its handshake timeout.
type holdDREQs struct {
	*holdDials
	gate  atomic.Pointer[chan struct{}]
	mu    sync.Mutex
	queue []chan struct{} // the held requests' own releases, first come first
}

func (k *holdDREQs) Connect(ctx context.Context, dst netip.AddrPort, ex kernel.Exchange, qpn uint32, pd []byte) (kernel.ID, error) {
	if k.holding(dst, ex, pd) {
		release := make(chan struct{})
		k.mu.Lock()
		k.queue = append(k.queue, release)
		k.mu.Unlock()
		select {
		case k.held <- struct{}{}:
			select {
			case <-release:
			case <-ctx.Done():
			}
		case <-ctx.Done():
		}
	}
	return k.Kernel.Connect(ctx, dst, ex, qpn, pd)
}

// next lets go of the held request that came first.
func (k *holdDREQs) next() {
	k.mu.Lock()
	defer k.mu.Unlock()
	close(k.queue[0])
	k.queue = k.queue[1:]
}

func (k *holdDREQs) Event(ctx context.Context, id kernel.ID) (kernel.Event, error) {
	ev, err := k.holdDials.Event(ctx, id)
	if g := k.gate.Load(); err == nil && ev.Type == kernel.EventDisconnected && g != nil {
		select {
		case <-*g:
		case <-ctx.Done():
		}
	}
	return ev, err
}

// A dial may rebuild each uplink it rides once for a TGT_GONE, not once in
// all: a second refusal refutes an uplink only where it names the TGT this
// dial's own rebuild of that uplink made. A dial that had rebuilt one uplink
// took a refusal over any later one (made by another dial once the first was
// refuted) for a lie, and spent an attempt on it: with a slow acceptor and
// connections closing fast, each new uplink's TGT died (its connection
// closed) before the requests queued behind it were answered, the dials
// ahead refuted it, a next dial made the next uplink, and
// TestEndpointManyDialsClosing's dials failed "the leg did not open in 16
// tries". Here two dials ride each uplink while its one connection closes,
// which ends its TGT; the uplink is refuted meanwhile (standing for the
// verdict of the dials ahead) and the next one made, 20 times: both dials
// still succeed, their deadline what bounds them.
func TestDialRebuildsEachUplinkOnce(t *testing.T) {
	w := newWorld(t)
	const node = "10.0.240.2"
	const rounds = 20 // past the 17 that failed a dial
	g := newHoldDials(node + ":7001")
	h := &holdDREQs{holdDials: g}
	s := w.wrappedEndpoint("10.0.240.1", 7000, func(k kernel.Kernel) kernel.Kernel { g.Kernel = k; return h }, longTimers)
	p := w.endpoint(node, 7001, longTimers)
	ctx := ctxT(t, 20*time.Second)
	r := w.endpoint(node, 7002, longTimers)
	sr, rs := pair(t, s, r) // the first uplink, its TGT held for this connection alone
	g.holds.Store(2 * (rounds + 1))
	dialed := dialsBehind(ctx, s, p.Addr().String(), 2)
	held := func(what string) {
		t.Helper()
		awaitBeforeDialEnds(t, ctx, g.held, dialed, what+": a request naming a TGT")
	}
	held("first request")
	held("first request")
	for i := range rounds {
		s.mu.Lock()
		u := sr.up
		u.refuted = true
		s.mu.Unlock()
		r2 := w.endpoint(node, 7003+i, longTimers)
		sr2, rs2 := pair(t, s, r2) // the next uplink
		s.mu.Lock()
		same := sr2.up == u
		s.mu.Unlock()
		if same {
			t.Fatalf("round %d: setup: the dial to %v rode the refuted uplink", i, r2.Addr())
		}
		gate := make(chan struct{})
		h.gate.Store(&gate)
		sr.Close()
		rs.Close()
		eventually(t, "the TGT's end", func() (bool, string) {
			n := r.Stats().Downlinks
			return n == 0, fmt.Sprintf("%v's TGT handles %d", r.Addr(), n)
		})
		s.mu.Lock()
		up := u.state == upUp
		s.mu.Unlock()
		if !up {
			t.Fatalf("round %d: setup: the uplink is not up (the dials hold it)", i)
		}
		// One refusal for u's current TGT while the other dial holds u
		// up; the second once the first has asked again over the next.
		h.next()
		held(fmt.Sprintf("round %d, first dial", i))
		h.next()
		held(fmt.Sprintf("round %d, second dial", i))
		h.gate.Store(nil)
		close(gate)
		r, sr, rs = r2, sr2, rs2
	}
	// The last requests name the newest uplink's TGT, alive.
	h.next()
	h.next()
	for range 2 {
		res := <-dialed
		if res.err != nil {
			t.Fatalf("dial to p after %d refusals over uplinks it had not rebuilt: %v", rounds, res.err)
		}
		defer res.c.Close()
		pc, err := p.Accept(ctx)
		if err != nil {
			t.Fatalf("accept on p: %v", err)
		}
		defer pc.Close()
	}
}
