package cm

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// After CloseWrite, Send fails with ErrClosed (CloseWrite's doc), also once
// the connection broke since: an RC Send said ErrPeerGone once a Recv or
// other round had taken in the failure, ErrClosed before (XRC says
// ErrClosed).
func TestSendAfterCloseWriteClosedAfterFailure(t *testing.T) {
	a, _, w := fakePair(t, fakeOpts{})
	ctx := ctxT(t)
	require.NoError(t, a.CloseWrite())
	w.ends[1].shutdown()
	a.peerGone("peer disconnected")
	_, err := a.Recv(ctx, make([]byte, 64))
	require.ErrorIs(t, err, ErrPeerGone, "the peer died without its FIN")
	err = a.Send(ctx, []byte("x"))
	require.ErrorIs(t, err, ErrClosed, "we ended our stream")
	require.NotErrorIs(t, err, ErrPeerGone)
	require.Equal(t, uint64(1), a.Stats().Errors)
}
