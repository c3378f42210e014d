package rdmacm

import (
	"context"
	"sync"
)

// eventQueue is an unbounded FIFO of one id's events. The pump pushes without
// ever blocking; consumers wait in pop. After close, pop returns what is left
// and then the close error (or the error at once when the rest was dropped).
type eventQueue struct {
	mu     sync.Mutex
	items  []Event
	err    error
	signal chan struct{} // capacity 1: "something changed"
	done   chan struct{} // closed by close
}

func (q *eventQueue) init() {
	q.signal = make(chan struct{}, 1)
	q.done = make(chan struct{})
}

func (q *eventQueue) wake() {
	select {
	case q.signal <- struct{}{}:
	default:
	}
}

// push appends e; it reports false when the queue is closed.
func (q *eventQueue) push(e Event) bool {
	q.mu.Lock()
	if q.err != nil {
		q.mu.Unlock()
		return false
	}
	q.items = append(q.items, e)
	q.mu.Unlock()
	q.wake()
	return true
}

func (q *eventQueue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items)
}

// pop returns the oldest event, waiting for one until ctx ends or the queue
// is closed.
func (q *eventQueue) pop(ctx context.Context) (Event, error) {
	for {
		q.mu.Lock()
		if n := len(q.items); n > 0 {
			e := q.items[0]
			q.items[0] = Event{}
			q.items = q.items[1:]
			if n == 1 {
				q.items = nil
			}
			q.mu.Unlock()
			if n > 1 {
				q.wake() // let another waiter see the rest
			}
			return e, nil
		}
		if q.err != nil {
			err := q.err
			q.mu.Unlock()
			return Event{}, err
		}
		q.mu.Unlock()
		select {
		case <-q.signal:
		case <-q.done:
		case <-ctx.Done():
			return Event{}, ctx.Err()
		}
	}
}

// close stops pushes and wakes every waiter. With drop, the queued events are
// removed and returned (so their new ids can be closed); otherwise waiters
// still receive them before err. The first error stays, except that
// ErrClosed, the application's Close of the id or of its channel, replaces
// an earlier one (the pump's failure): after Close, waits say ErrClosed.
func (q *eventQueue) close(err error, drop bool) []Event {
	q.mu.Lock()
	defer q.mu.Unlock()
	var rest []Event
	if drop {
		rest, q.items = q.items, nil
	}
	if q.err == nil {
		q.err = err
		close(q.done)
	} else if err == ErrClosed {
		q.err = err
	}
	return rest
}
