package cm

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A raw receiver gives each read buffer back to the device at once, as the
// plain librdmacm programs it talks to do: a raw peer has no credits, only
// the queue depth and the replies it sees, so a buffer held back for a
// repost chain was a receive it could not know was missing. A peer that
// filled the queue and sent one more after the receiver read one message
// met no receive buffer (an RNR NAK on a device).
func TestRawRecvRepostsEachBuffer(t *testing.T) {
	const depth = 8
	a, b, w := fakePair(t, fakeOpts{raw: true, depth: [2]int{depth, depth}})
	ctx := ctxT(t)
	for i := range depth {
		require.NoError(t, a.Send(ctx, []byte{byte(i)}))
	}
	buf := make([]byte, 256)
	n, err := b.Recv(ctx, buf)
	require.NoError(t, err)
	require.Equal(t, []byte{0}, buf[:n])
	// One message read: one buffer free for the peer.
	require.NoError(t, a.Send(ctx, []byte{depth}))
	w.mu.Lock()
	rnr := w.rnr
	w.mu.Unlock()
	require.Zero(t, rnr, "the send after the first read found no receive buffer")
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for i := 1; i <= depth; i++ {
		n, err := b.Recv(rctx, buf)
		require.NoError(t, err)
		require.Equal(t, []byte{byte(i)}, buf[:n])
	}
}
