package cm

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/xrc/memfabric"
)

// A framed peer that disconnects without its FIN (its process died) broke
// the connection: one error, logged (neither happened), where a FIN before
// the disconnect is the orderly end (neither).
func TestStatsPeerDeathCounted(t *testing.T) {
	for _, fin := range []bool{false, true} {
		a, b, w := fakePair(t, fakeOpts{})
		var logged []string
		a.log = func(msg string, _ ...any) { logged = append(logged, msg) }
		ctx := ctxT(t)
		require.NoError(t, b.Send(ctx, []byte("last words")))
		if fin {
			require.NoError(t, b.CloseWrite())
		}
		w.ends[1].shutdown()
		a.peerGone("peer disconnected")
		buf := make([]byte, 256)
		_, err := a.Recv(ctx, buf)
		require.NoError(t, err)
		_, err = a.Recv(ctx, buf)
		if fin {
			require.ErrorIs(t, err, io.EOF)
			require.Zero(t, a.Stats().Errors, "the peer ended its stream first")
			require.Empty(t, logged)
			continue
		}
		require.ErrorIs(t, err, ErrPeerGone)
		require.Equal(t, uint64(1), a.Stats().Errors, "a broken connection counts one error")
		require.Equal(t, []string{"connection failed"}, logged)
	}
}

// An XRC connection whose peer died counts one error, as an RC one does (an
// XRC Conn's Errors stayed 0); its own Close and deadlines count none.
func TestStatsXRCFailureCounted(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	f := memfabric.New()
	srv := f.Node("10.1.0.1").Process()
	c, s := fabricPair(ctx, t, srv, f.Node("10.1.0.2").Process(), nil, nil)
	short, cancelShort := context.WithTimeout(ctx, 10*time.Millisecond)
	_, err := c.Recv(short, make([]byte, 64))
	cancelShort()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Zero(t, c.Stats().Errors, "a deadline is the caller's")
	srv.Kill()
	for range 2 {
		_, err = c.Recv(ctx, make([]byte, 64))
		require.ErrorIs(t, err, ErrPeerGone)
	}
	require.Equal(t, uint64(1), c.Stats().Errors)
	require.NoError(t, s.Close())
	_, err = s.Recv(ctx, make([]byte, 64))
	require.ErrorIs(t, err, ErrClosed)
	require.Zero(t, s.Stats().Errors, "Close is the caller's")
}
