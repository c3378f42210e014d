package cm

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The peer half-closed (CloseWrite), we read its end of stream, and then
// its process died. Over RC that is no error (TestStatsPeerDeathCounted: a
// FIN, then a disconnect, which is also all that a peer's CloseWrite and
// Close send); over XRC, once the engine had taken in the death, Stats
// counted one: xrc.Conn.Err excused failures after a full FIN only.
func TestStatsXRCPeerHalfCloseThenDeathNotAnError(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	f := newFabric(t)
	srv, cli := f.Node("10.1.0.1").Process(), f.Node("10.1.0.2").Process()
	c, s := fabricPair(ctx, t, srv, cli, nil, nil)
	require.NoError(t, s.CloseWrite())
	_, err := c.Recv(ctx, make([]byte, 64))
	require.ErrorIs(t, err, io.EOF)
	srv.Kill()
	for err = nil; err == nil; {
		err = c.Send(ctx, []byte("to the dead"))
	}
	require.ErrorIs(t, err, ErrPeerGone)
	// The engine decides once it is done with the connection: its
	// endpoint (cli's, the dialer's) has none left.
	awaitConns(t, endpointOf(t, cli), 0, 10*time.Second)
	_, err = c.Recv(ctx, make([]byte, 64))
	require.ErrorIs(t, err, io.EOF, "the peer's data ended in order")
	require.Zero(t, c.Stats().Errors, "the peer ended its stream first, as over RC")
}
