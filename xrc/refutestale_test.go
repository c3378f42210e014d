package xrc

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/xrc/internal/wire"
)

// holdDials, while holds is above 0, holds each dial's VIRT_REQ (not a
// MOVE) to dst before it goes: it sends on held, then waits for release.
type holdDials struct {
	kernel.Kernel
	dst     netip.AddrPort
	holds   atomic.Int32
	held    chan struct{}
	release chan struct{}
}

func newHoldDials(dst string) *holdDials {
	return &holdDials{dst: netip.MustParseAddrPort(dst), held: make(chan struct{}), release: make(chan struct{})}
}

func (k *holdDials) Connect(ctx context.Context, dst netip.AddrPort, ex kernel.Exchange, qpn uint32, pd []byte) (kernel.ID, error) {
	if k.holding(dst, ex, pd) {
		select {
		case k.held <- struct{}{}:
			select {
			case <-k.release:
			case <-ctx.Done():
			}
		case <-ctx.Done():
		}
	}
	return k.Kernel.Connect(ctx, dst, ex, qpn, pd)
}

// holding reports whether a request is one to hold (and counts it down).
func (k *holdDials) holding(dst netip.AddrPort, ex kernel.Exchange, pd []byte) bool {
	var req wire.Req
	return ex == kernel.ExchangeSIDR && dst == k.dst && wire.DecodeReq(pd, wire.TypeVirtReq, &req) == nil &&
		req.Flags&wire.FlagMove == 0 && k.holds.Add(-1) >= 0
}

// dialsBehind starts n dials from s to addr in the background; their
// results come on the channel.
func dialsBehind(ctx context.Context, s *proc, addr string, n int) <-chan dialResult {
	dialed := make(chan dialResult, n)
	for range n {
		go func() {
			c, err := s.Dial(ctx, addr)
			dialed <- dialResult{c, err}
		}()
	}
	return dialed
}

// awaitBeforeDialEnds waits for ch (a request held, say); the test fails
// where one of the dials behind it ends first, or ctx does.
func awaitBeforeDialEnds(t *testing.T, ctx context.Context, ch <-chan struct{}, dialed <-chan dialResult, what string) {
	t.Helper()
	select {
	case <-ch:
	case res := <-dialed:
		t.Fatalf("a dial ended before %s: %v", what, res.err)
	case <-ctx.Done():
		t.Fatalf("no %s", what)
	}
}

// liveUplinks counts e's uplinks to node that are not gone, and those of
// them refuted.
func liveUplinks(e *Endpoint, node string) (live, refuted int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, u := range e.uplinks {
		if sameNode(u.node, netip.MustParseAddr(node)) && u.state != upNone {
			live++
			if u.refuted {
				refuted++
			}
		}
	}
	return live, refuted
}

// A dial is refused TGT_GONE twice by an honest process (p): each time its
// VIRT_REQ named a TGT that died while the request was on its way, and
// that a recovery had already replaced (a receiver of the uplink died: its
// next frame failed "remote invalid request", the recovery moved the legs
// to a new TGT, and the old TGT went with their moves). The second refusal
// refuted the uplink (10e5520), though the TGT it named was no longer the
// uplink's and its current one was healthy, q's live connection on it: the
// dial made a second uplink to the node and domain, and the first, passed
// over by every dial from then on, stayed for as long as q's connection
// lived. Each such dial added one more: here two dials, two receivers dying
// under each, left three uplinks, each an INI here and a TGT there. Only a
// refusal naming the uplink's current TGT refutes it; one naming a TGT the
// uplink has left is asked again over the current one.
func TestStaleTGTGoneDoesNotRefuteUplink(t *testing.T) {
	w := newWorld(t)
	const node = "10.0.233.2"
	g := newHoldDials(node + ":7001")
	s := w.wrappedEndpoint("10.0.233.1", 7000, func(k kernel.Kernel) kernel.Kernel { g.Kernel = k; return g }, longTimers)
	countedTags(s.Endpoint) // the legs made first sort first: they make each new TGT
	q := w.endpoint(node, 7000, longTimers)
	p := w.endpoint(node, 7001, longTimers)
	sq, qc := pair(t, s, q)
	ctx := ctxT(t, 20*time.Second)
	live := []*proc{q} // the processes of node that hold legs of ours
	// die kills r and sends to it: the send fails "remote invalid
	// request" and the uplink recovers onto a new TGT; it waits until
	// the recovery has ended and the TGT the uplink left is gone (each
	// live process holds only the new one: a handle kept until its SRQ
	// drained is let go of).
	die := func(r *proc, sc *Conn) {
		t.Helper()
		s.mu.Lock()
		u, old := sc.up, sc.up.cur
		s.mu.Unlock()
		r.p.Kill()
		live = slices.DeleteFunc(live, func(x *proc) bool { return x == r })
		if err := sc.Send(ctx, []byte("to the dead")); err != nil {
			t.Fatalf("send to the dead: %v (it returns once posted)", err)
		}
		eventually(t, "the recovery after "+r.Addr().String()+"'s death", func() (bool, string) {
			s.mu.Lock()
			done := u.cur != old && u.cur != nil && u.state == upUp && !u.settling
			st := fmt.Sprintf("uplink %v, INI replaced %v, settling %v, %s's connection: %v", u.state, u.cur != old, u.settling, r.Addr(), sc.err)
			s.mu.Unlock()
			var held []int
			for _, x := range live {
				n := x.Stats().Downlinks
				held = append(held, n)
				done = done && n == 1
			}
			return done, fmt.Sprintf("%s; TGT handles held %v", st, held)
		})
	}
	for round := range 2 {
		r1 := w.endpoint(node, 7002+2*round, longTimers)
		r2 := w.endpoint(node, 7003+2*round, longTimers)
		s1, _ := pair(t, s, r1)
		s2, _ := pair(t, s, r2)
		live = append(live, r1, r2)
		g.holds.Store(2)
		dialed := dialsBehind(ctx, s, p.Addr().String(), 1)
		held := func(what string) {
			t.Helper()
			awaitBeforeDialEnds(t, ctx, g.held, dialed, fmt.Sprintf("round %d: the request naming %s", round, what))
		}
		held("a first TGT")
		die(r1, s1)
		g.release <- struct{}{} // TGT_GONE: the uplink has left that TGT
		held("a second TGT")
		die(r2, s2)
		g.release <- struct{}{} // TGT_GONE again, for the TGT the uplink left
		res := <-dialed
		if res.err != nil {
			t.Fatalf("round %d: dial to p: %v", round, res.err)
		}
		defer res.c.Close()
		pc, err := p.Accept(ctx)
		if err != nil {
			t.Fatalf("round %d: accept on p: %v", round, err)
		}
		roundTrip(t, res.c, pc, []byte("p"))
		if round == 0 {
			live = append(live, p)
		}
	}
	roundTrip(t, sq, qc, []byte("q"))
	if n, refuted := liveUplinks(s.Endpoint, node); n != 1 || refuted != 0 {
		t.Fatalf("uplinks to %s: %d (%d refuted), want 1: its TGT is healthy, with q's and p's connections on it", node, n, refuted)
	}
}

// A refuted uplink goes once its legs have: refs count them as for any
// uplink (maybeTeardownLocked), so new dials passing it over leave nothing
// behind. The liar of TestPhysAcceptClaimingNeighbourDomain refutes its
// uplink; its connection closed, the uplink's INI goes, and the uplink
// the dial to h made is the node's only one.
func TestRefutedUplinkGoesWithItsLegs(t *testing.T) {
	w := newWorld(t)
	a := w.endpoint("10.0.234.1", 7000)
	h := w.endpoint("10.0.234.2", 7000)
	var armed atomic.Bool
	armed.Store(true)
	l := w.wrappedEndpoint("10.0.234.2", 7001, func(k kernel.Kernel) kernel.Kernel {
		return tamperAccept{k, &armed, func(acc *wire.Accept) { acc.DomainID = h.dom.ID }}
	}, func(c *Config) { c.DomainDir = t.TempDir() + "/other" })
	ctx := ctxT(t, 10*time.Second)
	lc, err := a.Dial(ctx, l.Addr().String())
	if err != nil {
		t.Fatalf("setup: dial to l: %v", err)
	}
	hc, err := a.Dial(ctx, h.Addr().String())
	if err != nil {
		t.Fatalf("dial to h: %v", err)
	}
	defer hc.Close()
	if n, refuted := liveUplinks(a.Endpoint, "10.0.234.2"); n != 2 || refuted != 1 {
		t.Fatalf("precondition: %d uplinks (%d refuted), want l's refuted beside h's", n, refuted)
	}
	lc.Close()
	eventually(t, "the refuted uplink's end", func() (bool, string) {
		n, refuted := liveUplinks(a.Endpoint, "10.0.234.2")
		st := a.Stats()
		return n == 1 && refuted == 0 && st.Uplinks == 1, fmt.Sprintf("%d uplinks (%d refuted); %+v", n, refuted, st)
	})
	hc2, err := a.Dial(ctx, h.Addr().String())
	if err != nil {
		t.Fatalf("a second dial to h: %v", err)
	}
	hc2.Close()
}
