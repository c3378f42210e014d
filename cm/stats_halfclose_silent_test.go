package cm

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The peer half-closed (CloseWrite), we read its end of stream, and then
// its node went off the fabric (a power cut: no disconnect, no answer).
// Over RC our sends run out of retries with no disconnect from the CM, a
// failure; over XRC the uplink's recovery found no answer and failed the
// connection ErrPeerGone, which xrc.Conn.Err excused after a half FIN as
// the peer's death: Stats counted nothing. The peer's silence is a failure
// (Err's doc), whether its idle timeout or a MOVE's finds it.
func TestStatsHalfCloseThenSilentCounted(t *testing.T) {
	t.Run("RC", func(t *testing.T) {
		a, b, w := fakePair(t, fakeOpts{})
		ctx := ctxT(t)
		require.NoError(t, b.CloseWrite())
		_, err := a.Recv(ctx, make([]byte, 64))
		require.ErrorIs(t, err, io.EOF)
		w.ends[1].shutdown() // b's QP drops everything; no disconnect comes
		for err = nil; err == nil; {
			err = a.Send(ctx, []byte("to the silent"))
		}
		require.ErrorIs(t, err, ErrPeerGone)
		require.Equal(t, uint64(1), a.Stats().Errors)
	})
	t.Run("XRC", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		f := newFabric(t)
		sn := f.Node("10.1.0.1")
		srv, cli := sn.Process(), f.Node("10.1.0.2").Process()
		opts := []Option{WithHandshakeTimeout(time.Second)}
		a, b := fabricPair(ctx, t, srv, cli, opts, opts)
		require.NoError(t, b.CloseWrite())
		_, err := a.Recv(ctx, make([]byte, 64))
		require.ErrorIs(t, err, io.EOF)
		sn.PowerOff()
		for err = nil; err == nil; {
			err = a.Send(ctx, []byte("to the silent"))
		}
		require.ErrorIs(t, err, ErrPeerGone)
		awaitConns(t, endpointOf(t, cli), 0, 20*time.Second)
		require.Equal(t, uint64(1), a.Stats().Errors, "the peer fell silent: a failure, as over RC")
	})
}
