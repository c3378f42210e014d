package xrc

import (
	"errors"
	"testing"
	"time"
)

// An acceptor whose Accept queue is full refuses the request (BUSY_RETRY),
// so the dialer's Dial fails. It used to fail the new connection once up,
// without a word to the dialer, whose Dial had returned: its Sends were
// dropped by tag, and it learnt only at its idle timeout.
func TestEndpointAcceptBacklogFullRefuses(t *testing.T) {
	w := newWorld(t)
	a, b := w.endpoint("10.0.80.1", 7000), w.endpoint("10.0.80.2", 7000)
	for i := range acceptBacklog {
		if _, err := a.Dial(ctxT(t, 5*time.Second), b.Addr().String()); err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
	}
	eventually(t, "backlog full", func() (bool, string) { return len(b.acceptq) == acceptBacklog, "" })
	c, err := a.Dial(ctxT(t, 5*time.Second), b.Addr().String())
	if err != nil {
		t.Logf("dial past the backlog refused: %v", err)
		return
	}
	start := time.Now()
	for i := range 3 {
		if err := c.Send(ctxT(t, time.Second), []byte("lost")); err != nil {
			t.Logf("send %d failed after %v: %v", i, time.Since(start), err)
			return
		}
	}
	time.Sleep(200 * time.Millisecond)
	dropped := b.Stats().Dropped
	_, err = c.Recv(ctxT(t, 5*time.Second), make([]byte, 8))
	t.Fatalf("Dial past a full backlog returned a connection; 3 Sends returned nil (acceptor dropped %d messages); Recv failed only after %v: %v (ErrPeerGone: %v)",
		dropped, time.Since(start), err, errors.Is(err, ErrPeerGone))
}
