package cm

import (
	"context"
	"io"
	"path/filepath"
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
	f := newFabric(t)
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
	s.Close() // its process is dead: nothing of it counts
	// A connection closed by its application, on both sides, counts none.
	c, s = fabricPair(ctx, t, f.Node("10.1.0.1").Process(), f.Node("10.1.0.2").Process(), nil, nil)
	require.NoError(t, s.Close())
	_, err = s.Recv(ctx, make([]byte, 64))
	require.ErrorIs(t, err, ErrClosed)
	require.Zero(t, s.Stats().Errors, "Close is the caller's")
	_, err = c.Recv(ctx, make([]byte, 64))
	require.ErrorIs(t, err, io.EOF)
	require.Zero(t, c.Stats().Errors, "the peer's orderly end")
}

// An XRC connection's credit frames are its Stats.CreditFrames, as an RC
// one's: the engine sent them for it while the Conn counted none.
func TestXRCConnCountsCreditFrames(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	f := newFabric(t)
	const depth, count = 4, 20
	opts := []Option{WithQueueDepth(depth)}
	c, s := fabricPair(ctx, t, f.Node("10.1.0.1").Process(), f.Node("10.1.0.2").Process(), opts, opts)
	errc := make(chan error, 1)
	go func() {
		for range count {
			if err := c.Send(ctx, []byte("x")); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	buf := make([]byte, 64)
	for range count {
		_, err := s.Recv(ctx, buf)
		require.NoError(t, err)
	}
	require.NoError(t, <-errc)
	// The sender holds at most a window of unreturned credits: the
	// messages past the first window came on credits the receiver sent
	// back, each frame at most a window's worth. (The count follows each
	// frame's post: wait a little for the last.)
	minFrames := uint64((count - depth + depth - 1) / depth)
	require.Eventually(t, func() bool { return s.Stats().CreditFrames >= minFrames }, 5*time.Second, time.Millisecond,
		"the receiver returned credits for %d messages over a %d-message window in %d frames", count, depth, s.Stats().CreditFrames)
	require.Zero(t, c.Stats().CreditFrames, "the sender read nothing: it owes no credits")
}

// Every failed Dial counts in DialErrors, also one refused before it tried
// a connection (its options, its local address), as DialContext counts one
// with an unknown network. Those Dials failed and counted nothing.
func TestEveryFailedDialCounted(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f := newFabric(t)
	cli := f.Node("10.1.0.2").Process()
	dom := WithDomainPath(filepath.Join(t.TempDir(), "xrc"))
	before := GlobalStats().DialErrors
	d := &Dialer{Options: []Option{WithFabric(cli), dom}}
	_, err := d.DialContext(ctx, "udp", "10.1.0.1:1")
	require.Error(t, err)
	_, err = Dial(ctx, "10.1.0.1:1", WithFabric(cli), dom, WithMessageSize(-1))
	require.Error(t, err)
	_, err = Dial(ctx, "10.1.0.1:1", WithFabric(cli), dom, WithLocalAddr("10.1.0.9"))
	require.Error(t, err)
	_, err = Dial(ctx, "10.1.0.1:1", WithFabric(&memfabric.Process{}), dom)
	require.Error(t, err)
	_, err = Dial(ctx, "10.1.0.1:1", WithFabric(cli), dom) // no listener there
	require.Error(t, err)
	require.Equal(t, uint64(5), GlobalStats().DialErrors-before, "five Dials failed")
}
