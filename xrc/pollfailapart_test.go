package xrc

import (
	"fmt"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// Two one-off send poll failures, apart: the first fails a keepalive's
// completion, which nothing sends again, so the recovery's new INI took no
// completion when the second failed the next message's. That was taken for
// a poll that fails on every INI (errSendPoll) and failed the connection,
// though the poll had worked in between. A recovery that a failed poll
// started now proves the new INI's poll with a keepalive of its own.
func TestEndpointSendPollFailsTwiceApart(t *testing.T) {
	w := newWorld(t)
	r := w.endpoint("10.0.7.8", 7000, longTimers)
	p := &pollFail{}
	s := w.wrappedEndpoint("10.0.7.7", 7000, func(k kernel.Kernel) kernel.Kernel { p.Kernel = k; return p }, longTimers)
	cs, cr := pair(t, s, r)
	ctx := ctxT(t, 10*time.Second)
	// settled waits for the recoveries so far to be done, and every send
	// polled, or the connection failed.
	settled := func(recoveries uint64) {
		t.Helper()
		eventually(t, fmt.Sprint("recovery ", recoveries, " done and every send polled"), func() (bool, string) {
			s.mu.Lock()
			defer s.mu.Unlock()
			if cs.err != nil {
				return true, ""
			}
			u := s.uplinks[0]
			n := len(u.cur.waiters)
			return s.recoveries.Load() == recoveries && u.state == upUp && !u.settling && n == 0, fmt.Sprint(n, " waiting")
		})
		if err := connErr(cs); err != nil {
			t.Fatalf("after %d send poll failures apart: %v", recoveries, err)
		}
	}
	settled(0)
	p.armed.Store(true)
	cs.post(kindHeartbeat, nil, nil) // the janitor's keepalive: its poll fails
	settled(1)
	p.armed.Store(true)
	if err := cs.Send(ctx, []byte("after the first failure")); err != nil {
		t.Fatal(err)
	}
	settled(2) // the message's poll failed: a second recovery
	buf := make([]byte, 64)
	if n, err := cr.Recv(ctx, buf); err != nil || string(buf[:n]) != "after the first failure" {
		t.Fatalf("recv: %q, %v", buf[:n], err)
	}
	roundTrip(t, cs, cr, []byte("after the second"))
}
