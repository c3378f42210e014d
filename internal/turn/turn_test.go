package turn

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Waiters whose contexts end leave; the others all get their turn, one at
// a time, however the two interleave (a wake-up taken by a leaving waiter
// is passed on).
func TestTurnWaitersLeaveAndTakeTurns(t *testing.T) {
	tr := New()
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
				if err := tr.Take(ctx); err != nil {
					assert.ErrorIs(t, err, context.DeadlineExceeded)
					gaveUp.Add(1)
					return
				}
				if inside.Add(1) != 1 {
					t.Error("two callers inside at once")
				}
				time.Sleep(10 * time.Microsecond)
				inside.Add(-1)
				done.Add(1)
				tr.Give()
			}()
		}
		wg.Wait()
		require.EqualValues(t, 8, done.Load()+gaveUp.Load())
		require.GreaterOrEqual(t, done.Load(), int32(4), "every waiter with a second to wait gets its turn")
	}
}
