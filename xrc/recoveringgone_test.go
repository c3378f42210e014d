package xrc

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// A dial that rebuilt its uplink once (p's TGT_GONE) is refused TGT_GONE
// again, each time for a TGT the uplink is leaving: the uplink is recovering
// from it (its TGT's maker died and its DREQ came, say), and the refusal is
// read before the new INI is up. The dial waits for that recovery, rightly
// (TestTGTGoneWhileSettlingDoesNotRefuteUplink), but then spent an attempt,
// where a refusal read after the recovery (TestStaleTGTGoneSpendsNoAttempt)
// spends none: 16 such rounds failed a healthy dial "the leg did not open in
// 16 tries". Here the uplink recovers under each of 20 requests.
func TestTGTGoneWhileRecoveringSpendsNoAttempt(t *testing.T) {
	w := newWorld(t)
	const node = "10.0.236.2"
	g := newHoldDials(node + ":7001")
	pm := &holdOneMove{dst: netip.MustParseAddrPort(node + ":7000"), ex: kernel.ExchangeXRC, armed: make(chan struct{}), held: make(chan struct{}), release: make(chan struct{})}
	s := w.wrappedEndpoint("10.0.236.1", 7000, func(k kernel.Kernel) kernel.Kernel {
		pm.Kernel = k
		g.Kernel = pm
		return g
	}, longTimers)
	q := w.endpoint(node, 7000, longTimers)
	var pk *refusingTGT
	p := w.wrappedEndpoint(node, 7001, func(k kernel.Kernel) kernel.Kernel {
		pk = &refusingTGT{Kernel: k}
		return pk
	}, longTimers)
	sq, qc := pair(t, s, q)
	s.mu.Lock()
	u := sq.up
	s.mu.Unlock()
	ctx := ctxT(t, 20*time.Second)
	const rounds = 20 // past the 16 attempts
	g.holds.Store(rounds + 2)
	close(pm.armed) // every recovery's PHYS_REQ to q waits for release
	pk.armed.Store(true)
	dialed := dialsBehind(ctx, s, p.Addr().String(), 1)
	await := func(ch chan struct{}, what string) {
		t.Helper()
		awaitBeforeDialEnds(t, ctx, ch, dialed, what)
	}
	settled := func(what string, old *iniQP) {
		t.Helper()
		eventually(t, what, func() (bool, string) {
			s.mu.Lock()
			done := u.cur != old && u.cur != nil && u.state == upUp && !u.settling
			st := u.state.String()
			s.mu.Unlock()
			// q's SRQ drained since: its next MOVE is not refused
			// BUSY_RETRY (a retry that pm would hold).
			n := q.Stats().Downlinks
			return done && n == 1, fmt.Sprintf("uplink %s; q's TGT handles %d", st, n)
		})
	}
	// p refuses the first request: the dial rebuilds u, once.
	await(g.held, "the dial's first VIRT_REQ")
	s.mu.Lock()
	old := u.cur
	s.mu.Unlock()
	g.release <- struct{}{}
	await(pm.held, "the rebuild's PHYS_REQ")
	pm.release <- struct{}{}
	settled("the dial's rebuild", old)
	for i := range rounds {
		what := fmt.Sprintf("round %d", i)
		await(g.held, what+": the dial's VIRT_REQ")
		s.mu.Lock()
		old, refs := u.cur, u.refs // the dial's reference among them
		s.failINILocked(u, old)
		s.mu.Unlock()
		await(pm.held, what+": the recovery's PHYS_REQ")
		g.release <- struct{}{} // TGT_GONE, for the TGT u recovers from
		eventually(t, what+": the dial reads the refusal", func() (bool, string) {
			s.mu.Lock()
			defer s.mu.Unlock()
			return u.refs < refs, fmt.Sprint(u.refs)
		})
		pm.release <- struct{}{}
		settled(what+": the recovery", old)
	}
	await(g.held, "the last VIRT_REQ")
	pk.armed.Store(false)
	g.release <- struct{}{}
	res := <-dialed
	if res.err != nil {
		t.Fatalf("dial to p after %d refusals for TGTs its uplink was leaving: %v", rounds, res.err)
	}
	defer res.c.Close()
	pc, err := p.Accept(ctx)
	if err != nil {
		t.Fatalf("accept on p: %v", err)
	}
	roundTrip(t, res.c, pc, []byte("p"))
	roundTrip(t, sq, qc, []byte("q"))
	if n, refuted := liveUplinks(s.Endpoint, node); n != 1 || refuted != 0 {
		t.Fatalf("uplinks to %s: %d (%d refuted), want 1", node, n, refuted)
	}
}
