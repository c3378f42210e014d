package xrc

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// staleGone is a dial from s to p, a process of node, whose VIRT_REQs are
// held (holds of them) until the test lets each go, over an uplink whose
// TGT q's connection makes (it sorts first). dieUnder makes the TGT a
// held request names one the uplink has left, and that dies.
type staleGone struct {
	t      *testing.T
	w      *world
	node   string
	g      *holdDials
	s, q   *proc
	p      *proc
	sq, qc *Conn
	ctx    context.Context
	dialed chan dialResult
	port   int
}

func newStaleGone(t *testing.T, node string, holds int32) *staleGone {
	w := newWorld(t)
	sg := &staleGone{t: t, w: w, node: node, port: 7002, dialed: make(chan dialResult, 1)}
	sg.g = &holdDials{dst: netip.MustParseAddrPort(node + ":7001"), held: make(chan struct{}), release: make(chan struct{})}
	local := netip.MustParseAddr(node).As4()
	local[3] = 1
	sg.s = w.wrappedEndpoint(netip.AddrFrom4(local).String(), 7000, func(k kernel.Kernel) kernel.Kernel { sg.g.Kernel = k; return sg.g }, longTimers)
	countedTags(sg.s.Endpoint) // q's leg made first sorts first: it makes each new TGT
	sg.q = w.endpoint(node, 7000, longTimers)
	sg.p = w.endpoint(node, 7001, longTimers)
	sg.sq, sg.qc = pair(t, sg.s, sg.q)
	sg.ctx = ctxT(t, 20*time.Second)
	sg.g.holds.Store(holds)
	go func() {
		c, err := sg.s.Dial(sg.ctx, sg.p.Addr().String())
		sg.dialed <- dialResult{c, err}
	}()
	return sg
}

// held waits until the dial's next request is held; ok is false where the
// dial ended first, with res.
func (sg *staleGone) held(what string) (res dialResult, ok bool) {
	sg.t.Helper()
	select {
	case <-sg.g.held:
		return res, true
	case res = <-sg.dialed:
		return res, false
	case <-sg.ctx.Done():
		sg.t.Fatalf("%s: the dial did not name a TGT", what)
		return res, false
	}
}

// dieUnder has a receiver of the uplink die under the request held: the
// send to it fails "remote invalid request" and the uplink recovers onto a
// new TGT, q's leg moved to it; the TGT the held request names dies with
// the move.
func (sg *staleGone) dieUnder(what string) {
	t := sg.t
	t.Helper()
	r := sg.w.endpoint(sg.node, sg.port, longTimers)
	sg.port++
	sr, _ := pair(t, sg.s, r)
	if res, ok := sg.held(what); !ok {
		t.Fatalf("%s: the dial ended before it named a TGT: %v", what, res.err)
	}
	s := sg.s
	s.mu.Lock()
	u, old := sr.up, sr.up.cur
	s.mu.Unlock()
	r.p.Kill()
	if err := sr.Send(sg.ctx, []byte("to the dead")); err != nil {
		t.Fatalf("%s: send to the dead: %v (it returns once posted)", what, err)
	}
	eventually(t, fmt.Sprintf("%s: the recovery after %v's death", what, r.Addr()), func() (bool, string) {
		s.mu.Lock()
		done := u.cur != old && u.cur != nil && u.state == upUp && !u.settling
		st := fmt.Sprintf("uplink %v, INI replaced %v, settling %v", u.state, u.cur != old, u.settling)
		s.mu.Unlock()
		n := sg.q.Stats().Downlinks
		return done && n == 1, fmt.Sprintf("%s; q's TGT handles %d", st, n)
	})
	sg.g.release <- struct{}{} // TGT_GONE, for the TGT the uplink left
}

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
	const rounds = 20 // past the 17 that failed the dial
	sg := newStaleGone(t, "10.0.239.2", rounds+1)
	for i := range rounds {
		sg.dieUnder(fmt.Sprintf("round %d", i))
	}
	// The last request names the uplink's current TGT, alive.
	if res, ok := sg.held("the last request"); !ok {
		t.Fatalf("the dial ended before it named the current TGT: %v", res.err)
	}
	sg.g.release <- struct{}{}
	res := <-sg.dialed
	if res.err != nil {
		t.Fatalf("dial to p after %d refusals for TGTs the uplink had left: %v", rounds, res.err)
	}
	defer res.c.Close()
	pc, err := sg.p.Accept(sg.ctx)
	if err != nil {
		t.Fatalf("accept on p: %v", err)
	}
	roundTrip(t, res.c, pc, []byte("p"))
	roundTrip(t, sg.sq, sg.qc, []byte("q"))
	if n, refuted := liveUplinks(sg.s.Endpoint, sg.node); n != 1 || refuted != 0 {
		t.Fatalf("uplinks to %s: %d (%d refuted), want 1", sg.node, n, refuted)
	}
}
