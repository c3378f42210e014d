package cm

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A connection broken before our Close: Recv after Close returns that
// failure (Close's doc), and Send as well, as over RC. Over XRC both said
// ErrClosed, the engine's answer after Close.
func TestXRCCallsAfterCloseReportEarlierFailure(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	f := newFabric(t)
	srv := f.Node("10.1.0.1").Process()
	c, _ := fabricPair(ctx, t, srv, f.Node("10.1.0.2").Process(), nil, nil)
	srv.Kill()
	_, err := c.Recv(ctx, make([]byte, 64))
	require.ErrorIs(t, err, ErrPeerGone)
	require.NoError(t, c.Close())
	_, err = c.Recv(ctx, make([]byte, 64))
	require.ErrorIs(t, err, ErrPeerGone, "Recv after Close: the failure that broke the connection before")
	require.ErrorIs(t, c.Send(ctx, []byte("x")), ErrPeerGone, "Send after Close: as Recv, and as over RC")
	require.ErrorIs(t, c.CloseWrite(), ErrPeerGone, "as it was already")
	require.Equal(t, uint64(1), c.Stats().Errors)

	// The RC side, for comparison: the same answers.
	a, _, w := fakePair(t, fakeOpts{})
	w.ends[1].shutdown()
	a.peerGone("peer disconnected")
	_, err = a.Recv(ctx, make([]byte, 64))
	require.ErrorIs(t, err, ErrPeerGone)
	require.NoError(t, a.Close())
	_, err = a.Recv(ctx, make([]byte, 64))
	require.ErrorIs(t, err, ErrPeerGone)
	require.ErrorIs(t, a.Send(ctx, []byte("x")), ErrPeerGone)
	require.ErrorIs(t, a.CloseWrite(), ErrPeerGone)
}
