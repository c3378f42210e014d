package cm

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A reader that reads one message and then stops calling must not keep
// the sender below its queue depth for ever. The read's credit is under
// the return threshold (half the window) and the sender was not short
// when it last sent, so it stays owed; the sender's next message leaves
// it short and says so, but an idle reader takes no completion and never
// learns it: the sender waited at depth-1 unread messages until the reader
// called again (the randomized parity test saw a Send wait at 3 unread,
// depth 4). The package doc promises the queue depth.
func TestConnIdleReaderOwesNoCredit(t *testing.T) {
	for _, depth := range []int{4, 8, 16} {
		t.Run(fmt.Sprint("depth", depth), func(t *testing.T) {
			a, b, w := fakePair(t, fakeOpts{depth: [2]int{depth, depth}})
			ctx := ctxT(t)
			// a sends until one more leaves it short, b reads one.
			require.NoError(t, sendN(ctx, a, depth-1))
			require.NoError(t, recvN(ctx, b, 1))
			// b stops calling. a has depth-2 messages unread at b and
			// may put two more there.
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second) // a hang guard, not a bound
			defer cancel()
			for i := range 2 {
				require.NoError(t, a.Send(sctx, []byte("more")),
					"send %d with %d unread: a %+v, b %+v", i, depth-2+i, a.Stats(), b.Stats())
			}
			w.mu.Lock()
			defer w.mu.Unlock()
			require.Zero(t, w.rnr)
		})
	}
}
