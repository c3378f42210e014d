package cm

import (
	"net/netip"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/internal/fakedns"
)

// A fabric node has one address, of one family (WithFabric): like a host
// whose RDMA netdev has no address of the other family, it has no route to
// that family, and a Dial there fails as a Dial from the same address named
// with WithLocalAddr does. The model connected the node to a node of the
// other family: a connection from [fd00::2] reached 10.1.0.1, which no
// device can carry, and a name's first address, of the other family, won
// over the node's own family's.
func TestFabricDialOtherFamilyUnreachable(t *testing.T) {
	ctx := ctxT(t)
	f := newFabric(t)
	client := f.Node("fd00::2").Process()
	for _, ip := range []string{"10.1.0.1", "fd00::1"} {
		n := f.Node(ip)
		l, err := Listen(ctx, netip.AddrPortFrom(n.Addr(), 7471).String(), WithFabric(n.Process()),
			WithDomainPath(filepath.Join(t.TempDir(), "s")))
		require.NoError(t, err)
		defer l.Close()
		go func() {
			for {
				c, err := l.Accept(ctx)
				if err != nil {
					return
				}
				c.Close()
			}
		}()
	}
	r := fakedns.Resolver(map[string][]netip.Addr{
		"both.test": {netip.MustParseAddr("10.1.0.1"), netip.MustParseAddr("fd00::1")},
	})
	dial := func(address string) (*Conn, error) {
		return Dial(ctx, address, WithFabric(client), WithResolver(r), WithDomainPath(filepath.Join(t.TempDir(), "c")))
	}

	c, err := dial("10.1.0.1:7471")
	if c != nil {
		c.Close()
	}
	require.ErrorIs(t, err, syscall.EHOSTUNREACH, "an IPv6 node dialed an IPv4 one")

	c, err = dial("both.test:7471")
	require.NoError(t, err)
	defer c.Close()
	require.Equal(t, "[fd00::1]:7471", c.RemoteAddr().String(), "the name's address of the node's family")
}
