package cm

import (
	"errors"
	"net"
	"testing"

	"github.com/stretchr/testify/require"
)

// The net.Conn adapter's errors are *net.OpError values, as a TCP
// connection's (NetConn's doc), CloseWrite's too: *net.TCPConn's CloseWrite
// fails with a *net.OpError whose Op is "close". The adapter's CloseWrite
// returned the Conn's own *OpError, so a caller that takes the adapter for
// a TCP connection (errors.As to *net.OpError, a proxy that logs its Op and
// addresses) found none, on a raw connection (ErrNotSupported), after the
// peer's death (ErrPeerGone) and after Close (net.ErrClosed) alike.
func TestNetConnCloseWriteErrorIsNetOpError(t *testing.T) {
	check := func(nc net.Conn, reason error) {
		t.Helper()
		err := nc.(interface{ CloseWrite() error }).CloseWrite()
		var oe *net.OpError
		require.True(t, errors.As(err, &oe), "CloseWrite: %T %v, want a *net.OpError", err, err)
		require.Equal(t, "close", oe.Op)
		require.Equal(t, "rdma", oe.Net)
		require.Equal(t, nc.LocalAddr(), oe.Source)
		require.Equal(t, nc.RemoteAddr(), oe.Addr)
		require.ErrorIs(t, err, reason)
	}

	// Raw messages have no end-of-stream frame.
	ra, _, _ := fakePair(t, fakeOpts{raw: true})
	check(ra.NetConn(), ErrNotSupported)

	// The peer died, and this side's CM said so.
	a, b, w := fakePair(t, fakeOpts{})
	w.ends[1].shutdown()
	a.peerGone("peer disconnected")
	check(a.NetConn(), ErrPeerGone)
	require.NoError(t, b.Close())

	// After the adapter's own Close.
	c, _, _ := fakePair(t, fakeOpts{})
	nc := c.NetConn()
	require.NoError(t, nc.Close())
	check(nc, net.ErrClosed)

	// A CloseWrite that succeeds still returns nil, and a second one too.
	d, _, _ := fakePair(t, fakeOpts{})
	cw := d.NetConn().(interface{ CloseWrite() error })
	require.NoError(t, cw.CloseWrite())
	require.NoError(t, cw.CloseWrite())
}
