package cm

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/goxrc/goxrc/xrc/memfabric"
	"github.com/stretchr/testify/require"
)

// CloseWrite waits only for room to post the end of the stream, never for
// the peer (its doc), over XRC as over RC: with credits left and the peer's
// process stalled (SIGSTOP'd, its SRQ out of receives), it returns at once
// with nil, and the peer reads io.EOF after the data once it runs again.
// Over XRC it waited for the FIN's completion, which a stalled receiver
// holds back: it blocked for the whole handshake timeout (30 s by default)
// and then failed with a deadline, although its FIN was posted and the peer
// read io.EOF after all; a second CloseWrite sent a second FIN.
func TestCloseWriteDoesNotWaitForAStalledPeer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	f := newFabric(t)
	f.AddNode("10.1.0.1", memfabric.NodeConfig{SRQReceives: 4})
	srv, cli := f.Node("10.1.0.1").Process(), f.Node("10.1.0.2").Process()
	hs := WithHandshakeTimeout(5 * time.Second)
	c, s := fabricPair(ctx, t, srv, cli, []Option{hs, WithQueueDepth(16)}, []Option{hs})
	srv.PauseReceives()
	for i := range 8 { // half the receiver's window: credits are left
		require.NoError(t, c.Send(ctx, []byte{byte(i)}))
	}
	start := time.Now()
	require.NoError(t, c.CloseWrite(), "the FIN was posted: the half-close went")
	// A hang bound, not a speed claim: the old wait was the 5 s timeout.
	require.Less(t, time.Since(start), 4*time.Second, "CloseWrite waited for the stalled peer")
	require.ErrorIs(t, c.Send(ctx, []byte("x")), ErrClosed)
	srv.ResumeReceives()
	buf := make([]byte, 64)
	for i := range 8 {
		n, err := s.Recv(ctx, buf)
		require.NoError(t, err)
		require.Equal(t, []byte{byte(i)}, buf[:n])
	}
	_, err := s.Recv(ctx, buf)
	require.Equal(t, io.EOF, err)
	require.NoError(t, c.CloseWrite(), "idempotent")
	require.NoError(t, s.Send(ctx, []byte("reply")), "the peer's side stays open")
	n, err := c.Recv(ctx, buf)
	require.NoError(t, err)
	require.Equal(t, "reply", string(buf[:n]))
	require.Zero(t, c.Stats().Errors)
	require.Zero(t, s.Stats().Errors)
}
