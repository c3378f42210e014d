// Package turn has Turn, a mutex whose waiters give up when their
// context ends.
package turn

import (
	"context"
	"sync"
	"sync/atomic"
)

// Turn serialises the callers of one operation (a Conn's Send, Recv or
// one-sided RDMA; a poll of one completion queue) like a mutex, except that a caller waiting for its turn gives up
// when its context ends: a Send with a deadline must not wait for ever
// behind a Send without one that is blocked on credits. Uncontended it
// costs a TryLock and an atomic load, which keeps the per-message path as
// cheap as with a plain mutex (a channel operation costs several mutex
// round trips under emulation). Make one with New: the zero Turn has no
// wake-up channel, and its waiters would wait until their contexts end.
type Turn struct {
	mu      sync.Mutex
	waiters atomic.Int32
	wake    chan struct{} // capacity 1: a turn may be free
}

// New returns a free turn.
func New() Turn { return Turn{wake: make(chan struct{}, 1)} }

// Take waits for the turn, or returns ctx's error.
func (t *Turn) Take(ctx context.Context) error {
	if t.mu.TryLock() {
		return nil
	}
	t.waiters.Add(1)
	defer t.waiters.Add(-1)
	for {
		if t.mu.TryLock() {
			return nil
		}
		select {
		case <-t.wake:
		case <-ctx.Done():
			// The wake-up this waiter may have taken belongs to the others.
			t.signal()
			return ctx.Err()
		}
	}
}

// Give ends the turn and wakes a waiter, if any.
func (t *Turn) Give() {
	t.mu.Unlock()
	if t.waiters.Load() > 0 {
		t.signal()
	}
}

func (t *Turn) signal() {
	select {
	case t.wake <- struct{}{}:
	default:
	}
}
