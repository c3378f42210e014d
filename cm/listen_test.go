package cm

import (
	"context"
	"errors"
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

// gatedTimewaitEnd's time-wait lasts until gate is closed (or the release's
// ctx ends): a test can then tell a Close that waits for it from one that
// does not with no clock.
type gatedTimewaitEnd struct {
	*fakeEnd
	gate <-chan struct{}
}

func (e gatedTimewaitEnd) release(ctx context.Context, vanished bool) error {
	err := e.fakeEnd.release(ctx, vanished)
	select {
	case <-e.gate:
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

// Once Close has begun, Accept hands out no queued connection: Close
// drains them only after its handshakes end, and a select between the
// queue and Close's signal picked the queue half the time.
func TestAcceptAfterCloseBeganRefuses(t *testing.T) {
	for range 200 {
		l := &Listener{ready: make(chan *Conn, 1), done: make(chan struct{}), inProgress: make(chan struct{}, 1)}
		l.inProgress <- struct{}{}
		l.ready <- &Conn{}
		close(l.done) // Close's first step
		if c, err := l.Accept(context.Background()); err == nil || c != nil {
			t.Fatalf("Accept after Close began: %v, %v; want ErrClosed", c, err)
		} else if !errors.Is(err, ErrClosed) {
			t.Fatalf("Accept after Close began: %v, want ErrClosed", err)
		}
	}
}

// Errors before any address is resolved still name the address given.
func TestSetupErrorsNameTheAddress(t *testing.T) {
	for _, err := range []error{
		func() error { _, err := Dial(context.Background(), "10.9.9.9:7471", WithQueueDepth(1)); return err }(),
		func() error { _, err := Listen(context.Background(), "10.9.9.9:7471", WithBacklog(-1)); return err }(),
	} {
		var oe *OpError
		if !errors.As(err, &oe) || oe.Addr != "10.9.9.9:7471" {
			t.Errorf("%v: want an *OpError naming 10.9.9.9:7471", err)
		}
	}
}
