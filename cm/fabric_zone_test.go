package cm

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// A link-local address with its zone, the form the package documentation
// asks for ("[fe80::1%eth0]:7471") and a dialer's RemoteAddr keeps, reaches
// the fabric node at that address: a zone names the link, and the fabric
// is one. The model looked nodes up by the address and its zone, so the
// Dial failed with EHOSTUNREACH, and memfabric made a second node of
// "fe80::1%eth0".
func TestFabricDialLinkLocalWithZone(t *testing.T) {
	ctx := ctxT(t)
	f := newFabric(t)
	server, client := f.Node("fe80::1"), f.Node("fe80::2")
	l, err := Listen(ctx, "[fe80::1]:7000", WithFabric(server.Process()), WithDomainPath(filepath.Join(t.TempDir(), "s")))
	require.NoError(t, err)
	defer l.Close()
	go func() {
		c, err := l.Accept(ctx)
		if err != nil {
			return
		}
		c.Send(ctx, []byte("hello"))
		c.Close()
	}()
	c, err := Dial(ctx, "[fe80::1%eth0]:7000", WithFabric(client.Process()), WithDomainPath(filepath.Join(t.TempDir(), "c")))
	require.NoError(t, err)
	defer c.Close()
	require.Equal(t, "[fe80::1%eth0]:7000", c.RemoteAddr().String(), "as dialed")
	buf := make([]byte, 16)
	n, err := c.Recv(ctx, buf)
	require.NoError(t, err)
	require.Equal(t, "hello", string(buf[:n]))
	require.Same(t, server, f.Node("fe80::1%eth0"), "one node, whatever the zone")
}

// A node made at an IPv4-mapped address is the IPv4 node, as Dial and
// Listen read the address: it was a node of its own that nobody could
// dial (Dial unmaps: EHOSTUNREACH), and its listeners' Addr was in the
// mapped form.
func TestFabricMappedNodeAddress(t *testing.T) {
	ctx := ctxT(t)
	f := newFabric(t)
	server := f.Node("::ffff:10.1.0.1")
	l, err := Listen(ctx, "10.1.0.1:7000", WithFabric(server.Process()), WithDomainPath(filepath.Join(t.TempDir(), "s")))
	require.NoError(t, err)
	defer l.Close()
	require.Equal(t, "10.1.0.1:7000", l.Addr().String())
	go func() {
		c, err := l.Accept(ctx)
		if err != nil {
			return
		}
		c.Send(ctx, []byte("hello"))
		c.Close()
	}()
	c, err := Dial(ctx, "[::ffff:10.1.0.1]:7000", WithFabric(f.Node("10.1.0.2").Process()), WithDomainPath(filepath.Join(t.TempDir(), "c")))
	require.NoError(t, err)
	defer c.Close()
	require.Equal(t, "10.1.0.1:7000", c.RemoteAddr().String())
	buf := make([]byte, 16)
	n, err := c.Recv(ctx, buf)
	require.NoError(t, err)
	require.Equal(t, "hello", string(buf[:n]))
	require.Same(t, server, f.Node("10.1.0.1"))
}
