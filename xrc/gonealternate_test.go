package xrc

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// Two receivers that take turns refusing their legs' MOVEs TGT_GONE, each
// accepting in the rounds the other refuses, still meet maxGoneRounds: the
// count is the uplink's rounds in a row with a refusal, which a leg's own
// MOVE accepted does not end. Counted per leg and ended so, every round
// would leave one leg behind and start the next, without end, each a new
// INI, physical link and TGT, the old ones kept (uplink.kept).
func TestTGTGoneRoundLimitLegsTakingTurns(t *testing.T) {
	rounds := &goneRounds{idx: map[uint32]int{}}
	parity := func(p int) refusal {
		return refuseWhere(func(qpn uint32) bool { return rounds.of(qpn)%2 == p })
	}
	g := newGoneScene(t, newWorld(t), "10.0.113", parity(0), parity(1))
	g.force(t)
	s, s2, s4, k2, k4 := g.s, g.conns[0], g.conns[1], g.refusers[0], g.refusers[1]
	eventually(t, "a refusing leg failed, the uplink settled", func() (bool, string) {
		s.mu.Lock()
		defer s.mu.Unlock()
		failed := s2.err != nil || s4.err != nil
		for _, u := range s.uplinks {
			if u.state != upUp || len(u.kept) != 0 || len(u.inis) != 1 {
				return false, fmt.Sprintf("%v kept %d inis %d", u.state, len(u.kept), len(u.inis))
			}
		}
		return failed, ""
	})
	if n := k2.refused.Load() + k4.refused.Load(); n != maxGoneRounds+1 {
		t.Errorf("%d MOVEs refused, want %d (sender %+v)", n, maxGoneRounds+1, s.Stats())
	}
	if n := s.Stats().Recoveries; n > maxGoneRounds+1 {
		t.Errorf("%d recoveries, want at most %d", n, maxGoneRounds+1)
	}
	for _, c := range []*Conn{s2, s4} {
		if err := connErr(c); err != nil && !errors.Is(err, ErrPeerGone) {
			t.Errorf("a refusing leg failed with %v, want ErrPeerGone", err)
		}
	}
}

// The limit's failure of a leg gives back what was kept for it: a Send that
// waited on the leg through the rounds returns ErrPeerGone naming the
// refusal, the leg's reference on the uplink goes, and so do the old links
// kept for it, the uplink back to one INI and a fresh count.
func TestTGTGoneRoundLimitGivesBack(t *testing.T) {
	g := newGoneScene(t, newWorld(t), "10.0.114", failINIThenRefuseAll)
	s, s2, k2 := g.s, g.conns[0], g.refusers[0]
	sent := make(chan error, 1)
	go func() {
		ctx := ctxT(t, 10*time.Second)
		for {
			if err := s2.Send(ctx, []byte("y")); err != nil {
				sent <- err
				return
			}
		}
	}()
	g.force(t)
	if err := <-sent; !errors.Is(err, ErrPeerGone) || !strings.Contains(err.Error(), "TGT_GONE") {
		t.Fatalf("send on r2's leg: %v, want ErrPeerGone for its refused MOVE", err)
	}
	if n := k2.refused.Load(); n != maxGoneRounds+1 {
		t.Errorf("r2 refused %d MOVEs, want %d", n, maxGoneRounds+1)
	}
	eventually(t, "what was kept for r2's leg given back", func() (bool, string) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if len(s.uplinks) != 1 {
			return false, fmt.Sprintf("%d uplinks", len(s.uplinks))
		}
		u := s.uplinks[0]
		_, leg := u.legs[s2]
		return u.state == upUp && len(u.kept) == 0 && len(u.inis) == 1 && u.refs == 1 && !leg && u.gone == 0,
			fmt.Sprintf("%v kept %d inis %d refs %d r2's leg %v gone %d", u.state, len(u.kept), len(u.inis), u.refs, leg, u.gone)
	})
}
