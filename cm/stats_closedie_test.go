package cm

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// We closed; the peer, stalled, had not answered our FIN when its process
// died. Over RC, Close released the connection, and nothing after it
// counts; over XRC, the engine's receiving leg waited for the peer's FIN,
// the death failed it, and Stats counted an error after our own Close
// (CloseWrite said ErrPeerGone instead of ErrClosed).
func TestStatsXRCPeerDiesAfterOurCloseNotAnError(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	f := newFabric(t)
	srv, cli := f.Node("10.1.0.1").Process(), f.Node("10.1.0.2").Process()
	_, s := fabricPair(ctx, t, srv, cli, nil, nil)
	cli.PauseReceives()
	require.NoError(t, s.Close())
	cli.Kill()
	// The engine is done with the connection once its endpoint (srv's,
	// the listener's) has none left.
	awaitConns(t, endpointOf(t, srv), 0, 10*time.Second)
	require.Zero(t, s.Stats().Errors, "Close ended the connection; what came after is no failure of it")
	err := s.CloseWrite()
	require.ErrorIs(t, err, ErrClosed)
	require.NotErrorIs(t, err, ErrPeerGone)
}
