package cm

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Conn.Transport says what carries a connection, and the net.Conn adapter
// leads back to its Conn (for Stats, say, where only the net.Conn is at
// hand).
func TestConnTransportAndAdapterConn(t *testing.T) {
	rc, rcPeer, _ := fakePair(t, fakeOpts{})
	require.Equal(t, TransportRC, rc.Transport())
	require.Equal(t, TransportRC, rcPeer.Transport())

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f := newFabric(t)
	x, xPeer := fabricPair(ctx, t, f.Node("10.1.0.1").Process(), f.Node("10.1.0.2").Process(), nil, nil)
	require.Equal(t, TransportXRC, x.Transport())
	require.Equal(t, TransportXRC, xPeer.Transport())
	require.Equal(t, "XRC", x.Transport().String())
	require.Equal(t, "RC", TransportRC.String())

	for _, c := range []*Conn{rc, x} {
		nc := c.NetConn()
		inner, ok := nc.(interface{ Conn() *Conn })
		require.True(t, ok, "the adapter has a Conn method")
		require.Same(t, c, inner.Conn())
	}
}

// Dialer.Dial gives the message connection with the Dialer's options.
func TestDialerDial(t *testing.T) {
	ctx, _, l, _, dopts := closingListener(t)
	defer l.Close()
	d := &Dialer{Options: append(dopts, WithMessageSize(2048))}
	c, err := d.Dial(ctx, l.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	s, err := l.Accept(ctx)
	require.NoError(t, err)
	defer s.Close()
	require.Equal(t, TransportXRC, c.Transport())
	require.Equal(t, 2048, c.MaxRecvSize(), "the Dialer's options apply")
	require.NoError(t, s.Send(ctx, []byte("to the Dialer's Conn")))
	buf := make([]byte, 64)
	n, err := c.Recv(ctx, buf)
	require.NoError(t, err)
	require.Equal(t, "to the Dialer's Conn", string(buf[:n]))
}

// The zero Transport, a nil or closed Conn's, prints as the type's doc
// names it; it printed "Transport(0)".
func TestTransportZeroStringIsNone(t *testing.T) {
	require.Equal(t, "none", (*Conn)(nil).Transport().String())
	require.Equal(t, "Transport(9)", Transport(9).String(), "an unknown value names its number")
}
