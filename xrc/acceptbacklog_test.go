package xrc

import (
	"errors"
	"fmt"
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
		var re *RejectError
		if !errors.As(err, &re) || re.Reason != RejectBusyRetry {
			t.Fatalf("dial past the backlog: %v, want BUSY_RETRY", err)
		}
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

// The same with a queue full of connections whose dialers closed them
// before Accept: a connection that finished in the queue left the count of
// unaccepted ones but not the queue, so the next request was accepted, its
// Dial returned, and the acceptor failed it at once for the full queue,
// without a word to the dialer (found by review). A queued connection now
// holds its slot until it leaves the queue: the next Dial is refused with
// BUSY_RETRY, and once Accept has taken one, a Dial gets through.
func TestEndpointAcceptBacklogFullOfFinishedRefuses(t *testing.T) {
	w := newWorld(t)
	a, b := w.endpoint("10.0.81.1", 7000), w.endpoint("10.0.81.2", 7000)
	keep, _ := pair(t, a, b) // accepted and open: a's TGT in b's node lives on
	defer keep.Close()
	for i := range acceptBacklog {
		c, err := a.Dial(ctxT(t, 5*time.Second), b.Addr().String())
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		c.Close()
	}
	eventually(t, "b's connections all finished, still queued", func() (bool, string) {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.conns) == 1 && len(b.acceptq) == acceptBacklog,
			fmt.Sprintf("conns %d, unaccepted %d, queued %d", len(b.conns), b.unaccepted, len(b.acceptq))
	})
	c, err := a.Dial(ctxT(t, 5*time.Second), b.Addr().String())
	var re *RejectError
	if !errors.As(err, &re) || re.Reason != RejectBusyRetry {
		if c != nil {
			c.Close()
		}
		t.Fatalf("Dial past an Accept queue full of finished connections: %v, want BUSY_RETRY", err)
	}
	if _, err := b.Accept(ctxT(t, 5*time.Second)); err != nil {
		t.Fatalf("Accept of a finished connection: %v", err)
	}
	c, err = a.Dial(ctxT(t, 5*time.Second), b.Addr().String())
	if err != nil {
		t.Fatalf("Dial once Accept took one: %v", err)
	}
	c.Close()
}
