package xrc

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// A recovery's PHYS_REQ that the CM itself times out (-ETIMEDOUT) is the
// receiver's silence, as one past the MOVE's deadline: its other legs are
// not asked again, one CM timeout each (the real CM's is seconds), while
// the node's other receivers hear nothing from us. Only the deadline
// marked the receiver silent, and each of its three legs cost a request.
func TestEndpointRecoveryCMTimeoutMarksSilent(t *testing.T) {
	w := newWorld(t)
	r := w.endpoint("10.0.7.10", 7000, longTimers)
	s, u, pf := w.unansweredAfterPollFail("10.0.7.9")
	var conns []*Conn
	for range 3 {
		cs, _ := pair(t, s, r)
		conns = append(conns, cs)
	}
	ctx := ctxT(t, 10*time.Second)
	u.all.Store(true)
	pf.armed.Store(true) // the next send poll fails: a recovery, whose requests nobody answers
	var err error
	for err == nil {
		err = conns[0].Send(ctx, []byte("to the silent"))
	}
	if !errors.Is(err, errUnanswered) {
		t.Fatalf("send: %v, want the unanswered MOVE (errUnanswered)", err)
	}
	eventually(t, "every leg to the silent receiver failed", func() (bool, string) {
		for i, c := range conns {
			if connErr(c) == nil {
				return false, fmt.Sprint("connection ", i, " up")
			}
		}
		return true, ""
	})
	if n := u.n.Load(); n != 1 {
		t.Fatalf("%d requests to the silent receiver, want 1 (its first leg's PHYS_REQ)", n)
	}
}
