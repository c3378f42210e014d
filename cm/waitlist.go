package cm

import "sync"

// waitList wakes the goroutines that wait for a connection's progress
// round to end (or for what release waits for). Each waiter has a channel
// of its own, so a wake reaches exactly the waiters that joined before it,
// whatever order they reach their receive in.
//
// It replaced one shared channel of tokens: a waiter that joined in a
// round and was preempted before its receive lost its token to one that
// joined the next round, and then waited for that round's end, which a
// leader blocked on an idle CQ can put off for ever (a one-sided request,
// completed, waited behind a Send that waited for credit: found by the
// stress test, in CI).
//
// The owner's mutex guards it. Channels come from a pool, so waiting
// allocates nothing.
type waitList struct {
	chans []chan struct{}
}

var wakePool = sync.Pool{New: func() any { return make(chan struct{}, 1) }}

// join adds a waiter and returns the channel its wake comes on.
func (l *waitList) join() chan struct{} {
	ch := wakePool.Get().(chan struct{})
	l.chans = append(l.chans, ch)
	return ch
}

// wakeAll wakes every waiter that joined.
func (l *waitList) wakeAll() {
	for i, ch := range l.chans {
		ch <- struct{}{} // never blocks: one wake per join, capacity one
		l.chans[i] = nil
	}
	l.chans = l.chans[:0]
}

// woken hands back the channel of a waiter that received its wake.
func woken(ch chan struct{}) { wakePool.Put(ch) }

// leave takes back the channel of a waiter that stopped waiting without
// receiving (its context ended, its timer fired): removed if not woken
// yet, drained if it was, so the pool gets it empty.
func (l *waitList) leave(ch chan struct{}) {
	for i, c := range l.chans {
		if c == ch {
			last := len(l.chans) - 1
			l.chans[i], l.chans[last] = l.chans[last], nil
			l.chans = l.chans[:last]
			wakePool.Put(ch)
			return
		}
	}
	select {
	case <-ch:
	default:
	}
	wakePool.Put(ch)
}

// len is the number of waiters.
func (l *waitList) len() int { return len(l.chans) }
