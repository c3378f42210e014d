package cm

import (
	"context"
	"testing"
	"time"
)

// timewaitEnd is a fake transport whose release waits out a time-wait, as
// the RDMA transport's waits for the CM's TIMEWAIT_EXIT (2.1-2.3 s on
// soft-RoCE, facts.md).
type timewaitEnd struct {
	*fakeEnd
	wait time.Duration
}

func (e timewaitEnd) release(ctx context.Context, vanished bool) error {
	err := e.fakeEnd.release(ctx, vanished)
	select {
	case <-time.After(e.wait):
	case <-ctx.Done():
	}
	return err
}

// Listener.Close closes the connections nobody accepted together, not one
// after another: it took one time-wait per connection (100 of them over 3
// minutes on soft-RoCE, while http.Server.Close held its lock).
func TestListenerCloseClosesUnacceptedTogether(t *testing.T) {
	const n, timewait = 5, 300 * time.Millisecond
	l := &Listener{
		ch:    &chanRef{refs: 2}, // someone else holds the (nil) channel
		ready: make(chan *Conn, n), done: make(chan struct{}),
		inProgress: make(chan struct{}, n),
	}
	ends := make([]*fakeEnd, n)
	for i := range n {
		a, _, w := fakePair(t, fakeOpts{})
		a.t = timewaitEnd{w.ends[0], timewait}
		ends[i] = w.ends[0]
		l.inProgress <- struct{}{}
		l.ready <- a
	}
	start := time.Now()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 3*timewait {
		t.Errorf("Listener.Close took %v for %d unaccepted connections, one time-wait (%v) each", took, n, timewait)
	}
	for i, e := range ends {
		e.w.mu.Lock()
		released := e.released
		e.w.mu.Unlock()
		if !released {
			t.Errorf("connection %d not released by Close", i)
		}
	}
}
