package xrc

import "testing"

// Stats.Recoveries counts the recoveries begun, not one that Close stopped
// before it could begin. While Close runs, failINILocked still lets a round
// through where a leg left on an old TGT (uplink.kept) waits for its FIN
// and the endpoint's context is live; Close cancels that context and stops
// spawns without e.mu, so it may do both between the guard and the spawn,
// which is refused: no recovery runs, and the round was counted all the
// same. The endpoint is put here in the state the guard sees at that
// instant, spawns already stopped.
func TestRecoveryStoppedByCloseNotCounted(t *testing.T) {
	w := newWorld(t)
	a := w.endpoint("10.0.99.61", 7000, longTimers)
	b := w.endpoint("10.0.99.62", 7000, longTimers)
	ca, _ := pair(t, a, b)
	before := a.Stats().Recoveries
	a.mu.Lock()
	u := ca.up
	q := u.cur
	if u.state != upUp || u.settling || q == nil {
		a.mu.Unlock()
		t.Fatalf("setup: uplink state %v, settling %v", u.state, u.settling)
	}
	a.closed, u.kept = true, []*iniQP{q}
	a.spawnMu.Lock()
	a.spawnStopped = true
	a.spawnMu.Unlock()
	a.failINILocked(u, q)
	// Back as it was, for the real Close at the test's end.
	a.spawnMu.Lock()
	a.spawnStopped = false
	a.spawnMu.Unlock()
	a.closed, u.kept = false, nil
	u.setState(upUp)
	a.mu.Unlock()
	if n := a.Stats().Recoveries - before; n != 0 {
		t.Errorf("%d recoveries counted, none ran (Close had stopped the spawns)", n)
	}
}
