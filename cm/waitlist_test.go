package cm

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestWaitListWakeIsAddressed: a wake reaches the waiter that joined before
// it even when one that joined after it looks first. With one shared
// channel of tokens the later waiter took it, and the earlier one waited
// for the next round's end (the stress test's hang: a completed one-sided
// request behind a leader asleep on an idle CQ).
func TestWaitListWakeIsAddressed(t *testing.T) {
	var l waitList
	early := l.join()
	l.wakeAll()
	late := l.join() // the next round's waiter, first to its receive
	require.Empty(t, late, "a waiter that joined after the wake was woken by it")
	require.Len(t, early, 1, "the waiter that joined before the wake was not woken")
	require.Equal(t, 1, l.len(), "only the later waiter still waits")

	<-early
	woken(early)
	l.leave(late) // its context ended
	require.Zero(t, l.len())
}

// TestWaitListLeave: a waiter that gives up is removed if not woken yet, and
// its channel drained if it was (a pooled channel with a wake in it would
// end some later waiter's wait at once).
func TestWaitListLeave(t *testing.T) {
	var l waitList
	a, b, c := l.join(), l.join(), l.join()
	l.leave(b)
	require.Equal(t, 2, l.len())
	l.wakeAll()
	require.Len(t, a, 1)
	require.Empty(t, b, "a waiter that left was woken")
	require.Len(t, c, 1)
	l.leave(c) // woken, then its timer fired first
	require.Empty(t, c, "a left channel kept its wake")
	<-a
	woken(a)
	require.Zero(t, l.len())
}

// TestWaitListWakesEveryJoined: many waiters joining over many rounds, each
// woken by the first wake after it joined.
func TestWaitListWakesEveryJoined(t *testing.T) {
	var l waitList
	var pending []chan struct{}
	for round := range 100 {
		for range round % 7 {
			pending = append(pending, l.join())
		}
		l.wakeAll()
		for _, ch := range pending {
			require.Len(t, ch, 1, "round %d: a waiter was not woken", round)
			<-ch
			woken(ch)
		}
		pending = pending[:0]
	}
}
