package cm

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Waiters whose contexts end leave; the others all get their turn, one at
// a time, however the two interleave (a wake-up taken by a leaving waiter
// is passed on).
func TestTurnWaitersLeaveAndTakeTurns(t *testing.T) {
	tr := newTurn()
	for round := 0; round < 200; round++ {
		var inside, done, gaveUp atomic.Int32
		var wg sync.WaitGroup
		for i := 0; i < 8; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				d := time.Second
				if i%2 == 1 {
					d = time.Duration(i) * 20 * time.Microsecond
				}
				ctx, cancel := context.WithTimeout(context.Background(), d)
				defer cancel()
				if err := tr.take(ctx); err != nil {
					require.ErrorIs(t, err, context.DeadlineExceeded)
					gaveUp.Add(1)
					return
				}
				if inside.Add(1) != 1 {
					t.Error("two callers inside at once")
				}
				time.Sleep(10 * time.Microsecond)
				inside.Add(-1)
				done.Add(1)
				tr.give()
			}()
		}
		wg.Wait()
		require.EqualValues(t, 8, done.Load()+gaveUp.Load())
		require.GreaterOrEqual(t, done.Load(), int32(4), "every waiter with a second to wait gets its turn")
	}
}

// A second Send or Recv waiting behind one that is blocked without a
// deadline (no credit; no message) gives up when its own context ends.
func TestConnSecondCallerHonoursContext(t *testing.T) {
	for _, op := range []string{"send", "recv"} {
		t.Run(op, func(t *testing.T) {
			a, _, _ := fakePair(t, fakeOpts{depth: [2]int{2, 2}})
			bg, cancelBG := context.WithCancel(context.Background())
			call := func(ctx context.Context) error {
				if op == "send" {
					return a.Send(ctx, make([]byte, 16))
				}
				_, err := a.Recv(ctx, make([]byte, 256))
				return err
			}
			first := make(chan struct{})
			go func() {
				defer close(first)
				for call(bg) == nil { // sends until out of credit; the peer never reads
				}
			}()
			time.Sleep(50 * time.Millisecond)
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			second := make(chan error, 1)
			go func() { second <- call(ctx) }()
			defer func() { cancelBG(); <-first }()
			select {
			case err := <-second:
				require.True(t, errors.Is(err, context.DeadlineExceeded), "second %s: %v", op, err)
			case <-time.After(2 * time.Second):
				t.Fatalf("second %s with a 100 ms deadline still waiting after 2 s", op)
			}
		})
	}
}
