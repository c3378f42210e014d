package cm

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A reader whose reaper runs while a Recv reposts the buffer it read must
// not stop the reaper with that buffer owed: the buffer is then neither
// queued nor posted (reposting), the reaper took it for nothing owed and
// stopped, and the sender's frame that says it is short, which only a
// round takes, waited for the reader's next call. Here the reader reads
// one message of two, its reaper runs during the repost, and it stops
// calling: its sender, one message below the queue depth, waited for ever
// for a buffer the reader had freed.
func TestConnReaperDuringRepostKeepsRunning(t *testing.T) {
	const depth = 3 // 4 credits, one kept back; the repost chain is 1 buffer
	a, b, w := fakePair(t, fakeOpts{depth: [2]int{depth, depth}})
	h := &repostHold{fakeEnd: w.ends[1], armed: make(chan struct{}, 1), reached: make(chan struct{}),
		free: make(chan struct{}), fin: make(chan struct{})}
	b.t = h
	ctx := ctxT(t)
	require.NoError(t, sendN(ctx, a, 2)) // a: 2 credits left, not short
	h.armed <- struct{}{}
	got := make(chan error, 1)
	go func() {
		_, err := b.Recv(ctx, make([]byte, 256))
		got <- err
	}()
	<-h.reached // b's Recv reposts the buffer it read, which waits
	// b's reaper runs now (its timer, armed by the read, is stopped here
	// and the round made by hand; a run of the timer meanwhile is the same).
	b.mu.Lock()
	b.reapTimer.Stop()
	b.reapArmed = false
	b.mu.Unlock()
	b.reap()
	close(h.free)
	require.NoError(t, <-got)
	// b makes no call from here. a has one message unread at b and may
	// put two more there; the second needs the buffer b read.
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second) // a hang guard, not a bound
	defer cancel()
	for i := range 2 {
		require.NoError(t, a.Send(sctx, []byte("more")),
			"send %d with %d unread: a %s, b %s", i, 1+i, connState(a), connState(b))
	}
}
