package xrc

import (
	"fmt"
	"testing"
	"time"
)

// A MOVE is a sign of its sender's life, as a frame is: the receiver's idle
// clock for the leg counts from it. It did not. The sender sends nothing on
// any leg to the node while its recovery moves them, a PHYS_REQ to a
// receiver that does not answer (one budget, half the sender's idle
// timeout) going first, and a moved leg with nothing to send again is
// heard from at the sender's next keepalive, up to half a heartbeat after
// its MOVE. A receiver could take its sender for dead in that half
// heartbeat, just after answering its MOVE (a receiver's idle timeout of
// 180 ms, a sender's of 300 ms and heartbeats of 100 ms: one run in six).
// Here no frame goes after the MOVE (no keepalive within the test), and
// the receiver's clock, set back before the recovery, must have moved to
// the MOVE.
func TestMovedLegRestartsIdleClock(t *testing.T) {
	w := newWorld(t)
	s := w.endpoint("10.0.216.1", 7000, longTimers)
	r := w.endpoint("10.0.216.2", 7000, longTimers)
	cs, cr := pair(t, s, r)
	old := backdateIdle(r, cr)
	moved := s.Stats().LegsMoved
	s.mu.Lock()
	u := cs.up
	s.failINILocked(u, u.cur)
	s.mu.Unlock()
	eventually(t, "the leg moved, the uplink up", func() (bool, string) {
		st := s.Stats()
		s.mu.Lock()
		defer s.mu.Unlock()
		return st.LegsMoved > moved && u.state == upUp && !cs.unmoved, fmt.Sprintf("%+v", st)
	})
	awaitIdleRestarted(t, r, cr, old, "the receiver's idle clock restarted by the MOVE")
	roundTrip(t, cs, cr, []byte("after the move"))
}

// backdateIdle sets c's idle clock a minute back, and returns the time set.
func backdateIdle(r *proc, c *Conn) time.Time {
	old := time.Now().Add(-time.Minute)
	r.mu.Lock()
	c.lastSeen = old
	r.mu.Unlock()
	return old
}

// awaitIdleRestarted waits until c's idle clock has moved past old: the
// acceptor restarts it after it has answered the MOVE, which its sender may
// have read before.
func awaitIdleRestarted(t *testing.T, r *proc, c *Conn, old time.Time, what string) {
	t.Helper()
	eventually(t, what, func() (bool, string) { return idleRestarted(r, c, old), "" })
}

// idleRestarted reports whether c's idle clock has moved past old.
func idleRestarted(r *proc, c *Conn, old time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return c.lastSeen.After(old)
}
