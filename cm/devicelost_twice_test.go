package cm

import (
	"context"
	"errors"
	"io"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/verbs"
)

// A device taken away from the process reports DEVICE_FATAL and then the
// RDMA CM's DEVICE_REMOVAL (async.go: drivers send the first before the
// second, which "then finds the connection failed already"): deviceLost
// runs twice. The second found closing set by the Close that the first
// started, and took that Close for the application's (lostClose =
// !closing): the application, which closed nothing, then got ErrClosed
// after the peer's end, ErrPeerGone from Send after its CloseWrite (and an
// error from a CloseWrite again), and Recv dropped what the first loss had
// kept for it.
func TestDeviceFatalThenRemovalIsNotClosed(t *testing.T) {
	fatal := verbs.AsyncEvent{Type: verbs.EventDeviceFatal}
	lose := func(a *Conn) {
		a.asyncEvent(fatal) // DEVICE_FATAL
		<-a.freed           // released by deviceLost's Close
		a.deviceRemoved()   // the CM's DEVICE_REMOVAL after it
	}
	t.Run("after the peer's end", func(t *testing.T) {
		a, b, _ := fakePair(t, fakeOpts{})
		ctx := ctxT(t)
		require.NoError(t, b.Close())
		_, err := a.Recv(ctx, make([]byte, 64))
		require.ErrorIs(t, err, io.EOF)
		lose(a)
		_, err = a.Recv(ctx, make([]byte, 64))
		require.ErrorIs(t, err, io.EOF, "Recv after the peer's end and the device loss")
		for name, err := range map[string]error{
			"Send":       a.Send(context.Background(), []byte("x")),
			"CloseWrite": a.CloseWrite(),
		} {
			require.False(t, errors.Is(err, ErrClosed), "%s: %v; the application did not close", name, err)
			require.ErrorIs(t, err, ErrPeerGone, name)
		}
	})
	t.Run("after CloseWrite", func(t *testing.T) {
		a, _, _ := fakePair(t, fakeOpts{})
		require.NoError(t, a.CloseWrite())
		lose(a)
		require.ErrorIs(t, a.Send(context.Background(), []byte("x")), ErrClosed, "Send after CloseWrite (its doc)")
		require.NoError(t, a.CloseWrite(), "CloseWrite again (its doc: nil until Close)")
	})
	t.Run("messages taken in", func(t *testing.T) {
		a, b, _ := fakePair(t, fakeOpts{})
		ctx := ctxT(t)
		require.NoError(t, b.Send(ctx, []byte("kept")))
		lose(a)
		buf := make([]byte, 64)
		n, err := a.Recv(ctx, buf)
		require.NoError(t, err, "a message taken in before the device went is still read (Recv's doc)")
		require.Equal(t, "kept", string(buf[:n]))
	})
}
