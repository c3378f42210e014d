package xrc

import (
	"fmt"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// A dial whose every request names a TGT that the uplink leaves, and that
// dies, before the answer comes: an honest acceptor refuses each TGT_GONE,
// a refusal about a TGT the uplink no longer uses, which the dial asks again
// over the current one (TestStaleTGTGoneDoesNotRefuteUplink). Each such
// answer spent one of its 16 attempts, so a healthy dial failed "the leg did
// not open in 16 tries" after 17 of them: with a slow acceptor (each answer
// a few ms late) and connections coming and going fast, each TGT the uplink
// moved to died before the queued requests naming it were answered, and
// TestEndpointManyDialsClosing's dials failed so. Here a receiver of the
// uplink dies under each request, 20 times in one dial: the dial still
// succeeds, its deadline what bounds it.
func TestStaleTGTGoneSpendsNoAttempt(t *testing.T) {
	w := newWorld(t)
	const node = "10.0.239.2"
	const rounds = 20 // past the 17 that failed the dial
	g := newHoldDials(node + ":7001")
	s := w.wrappedEndpoint("10.0.239.1", 7000, func(k kernel.Kernel) kernel.Kernel { g.Kernel = k; return g }, longTimers)
	countedTags(s.Endpoint) // q's leg made first sorts first: it makes each new TGT
	q := w.endpoint(node, 7000, longTimers)
	p := w.endpoint(node, 7001, longTimers)
	sq, qc := pair(t, s, q)
	ctx := ctxT(t, 20*time.Second)
	g.holds.Store(rounds + 1)
	dialed := dialsBehind(ctx, s, p.Addr().String(), 1)
	for i := range rounds {
		r := w.endpoint(node, 7002+i, longTimers)
		sr, _ := pair(t, s, r)
		awaitBeforeDialEnds(t, ctx, g.held, dialed, fmt.Sprintf("round %d: the request naming a TGT", i))
		// r dies; the send to it fails "remote invalid request" and the
		// uplink recovers onto a new TGT, q's leg moved to it: the TGT
		// the held request names dies with the move.
		s.mu.Lock()
		u, old := sr.up, sr.up.cur
		s.mu.Unlock()
		r.p.Kill()
		if err := sr.Send(ctx, []byte("to the dead")); err != nil {
			t.Fatalf("round %d: send to the dead: %v (it returns once posted)", i, err)
		}
		eventually(t, fmt.Sprintf("round %d: the recovery after %v's death", i, r.Addr()), func() (bool, string) {
			s.mu.Lock()
			done := u.cur != old && u.cur != nil && u.state == upUp && !u.settling
			st := fmt.Sprintf("uplink %v, INI replaced %v, settling %v", u.state, u.cur != old, u.settling)
			s.mu.Unlock()
			n := q.Stats().Downlinks
			return done && n == 1, fmt.Sprintf("%s; q's TGT handles %d", st, n)
		})
		g.release <- struct{}{} // TGT_GONE, for the TGT the uplink left
	}
	// The last request names the uplink's current TGT, alive.
	awaitBeforeDialEnds(t, ctx, g.held, dialed, "the request naming the current TGT")
	g.release <- struct{}{}
	res := <-dialed
	if res.err != nil {
		t.Fatalf("dial to p after %d refusals for TGTs the uplink had left: %v", rounds, res.err)
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
