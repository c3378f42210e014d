package xrc

import (
	"fmt"
	"testing"
)

// A receiver that refuses its leg's MOVE TGT_GONE round after round has the
// leg fail after maxGoneRounds rounds, also where each round's new INI has
// failed before the refusal came (its TGT side's DREQ): such a round was not
// counted (only a refusal that found the INI whole was), and the rounds went
// on for as long as the endpoint lived, each one a new INI, physical link and
// TGT, the old ones kept for the leg (uplink.kept).
func TestTGTGoneRoundsCountedWhenINIFailedFirst(t *testing.T) {
	g := newGoneScene(t, newWorld(t), "10.0.104", failINIThenRefuseAll)
	g.force(t)
	s, s2, k2 := g.s, g.conns[0], g.refusers[0]
	eventually(t, "r2's leg failed", func() (bool, string) {
		return connErr(s2) != nil, fmt.Sprintf("%+v", s.Stats())
	})
	// maxGoneRounds refusals the leg waits through, then the one that
	// fails it.
	if n := k2.refused.Load(); n > maxGoneRounds+1 {
		t.Fatalf("r2 refused %d MOVEs, want at most %d (sender %+v)", n, maxGoneRounds+1, s.Stats())
	}
}

// Every leg refused TGT_GONE in a round is treated alike: a round counted
// toward maxGoneRounds leaves each of its refused legs for the next one.
// The limit was checked per refusal against the count that round's own
// first refusal had just raised, so in the round that reached
// maxGoneRounds the first answer left its leg for another round and every
// later one failed its leg at once, one round short of the bound: which
// leg failed then was the order the parallel MOVEs were answered in.
func TestTGTGoneRoundLimitSameForEveryLeg(t *testing.T) {
	g := newGoneScene(t, newWorld(t), "10.0.109", failINIThenRefuseAll, failINIThenRefuseAll)
	g.force(t)
	s, s2, s4 := g.s, g.conns[0], g.conns[1]
	eventually(t, "r2's and r4's legs failed", func() (bool, string) {
		return connErr(s2) != nil && connErr(s4) != nil, fmt.Sprintf("%+v", s.Stats())
	})
	// Each leg waits through maxGoneRounds refusals; the next fails it.
	for name, k := range map[string]*refusingTGT{"r2": g.refusers[0], "r4": g.refusers[1]} {
		if n := k.refused.Load(); n != maxGoneRounds+1 {
			t.Errorf("%s refused %d MOVEs, want %d (sender %+v)", name, n, maxGoneRounds+1, s.Stats())
		}
	}
}
