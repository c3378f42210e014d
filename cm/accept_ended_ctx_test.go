package cm

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// An Accept whose context has ended says so, as Send and Recv do (they
// look at ctx first), whatever waits in the queue: the connection stays
// there for the next Accept. Accept's select had the queue and ctx ready
// at once and picked either at random: a server that cancels its context
// to stop accepting got, half the time, one more connection to serve. The
// 32 Accepts below each pick one of two ready cases, so the old code fails
// every run but one in 2^32; RC's queue and XRC's (the engine's) alike.
func TestAcceptWithEndedContextSaysSo(t *testing.T) {
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	acceptAll := func(t *testing.T, l *Listener) {
		t.Helper()
		for i := range 32 {
			c, err := l.Accept(ended)
			if c != nil {
				c.Close()
			}
			require.ErrorIs(t, err, context.Canceled, "Accept %d, its context ended, a connection queued", i)
			require.Nil(t, c, "Accept %d", i)
		}
	}
	t.Run("RC", func(t *testing.T) {
		l := &Listener{
			ch:    &chanRef{refs: 2}, // someone else holds the (nil) channel
			ready: make(chan *Conn, 1), done: make(chan struct{}),
			inProgress: make(chan struct{}, 1),
		}
		t.Cleanup(func() { l.Close() })
		a, _, _ := fakePair(t, fakeOpts{})
		l.inProgress <- struct{}{}
		l.ready <- a
		acceptAll(t, l)
		c, err := l.Accept(ctxT(t))
		require.NoError(t, err)
		require.Same(t, a, c, "the queued connection, for the next Accept")
	})
	t.Run("XRC", func(t *testing.T) {
		ctx := ctxT(t)
		f := newFabric(t)
		srv, cli := f.Node("10.1.7.1").Process(), f.Node("10.1.7.2").Process()
		l, err := Listen(ctx, "10.1.7.1:0", WithFabric(srv), WithDomainPath(filepath.Join(t.TempDir(), "xrc")))
		require.NoError(t, err)
		t.Cleanup(func() { l.Close() })
		d, err := Dial(ctx, l.Addr().String(), WithFabric(cli), WithDomainPath(filepath.Join(t.TempDir(), "xrc")))
		require.NoError(t, err)
		t.Cleanup(func() { d.Close() })
		// The dialer's first message is in once the connection is
		// the listener's to accept.
		require.NoError(t, d.Send(ctx, []byte("hello")))
		time.Sleep(50 * time.Millisecond)
		acceptAll(t, l)
		c, err := l.Accept(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		buf := make([]byte, 16)
		n, err := c.Recv(ctx, buf)
		require.NoError(t, err)
		require.Equal(t, "hello", string(buf[:n]))
	})
}
