package cm

import (
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/internal/fakedns"
)

// An unspecified local address (WithLocalAddr("::"), "::%eth0" or "0.0.0.0") binds
// nothing, so it keeps Dial to no family: net.Dialer filters a name's
// addresses by LocalAddr's family only when LocalAddr is not a wildcard
// (net.Resolver.resolveAddrList), and dials either family from one.
func TestFabricDialWildcardLocalAddr(t *testing.T) {
	for _, tc := range []struct {
		server, client, local, address string
	}{
		{"10.1.0.1", "10.1.0.2", "::", "10.1.0.1:7471"},
		{"10.1.0.1", "10.1.0.2", "::", "four.test:7471"},
		{"fd00::1", "fd00::2", "0.0.0.0", "[fd00::1]:7471"},
		{"fd00::1", "fd00::2", "0.0.0.0", "six.test:7471"},
		{"10.1.0.1", "10.1.0.2", "::%eth0", "10.1.0.1:7471"}, // a zone picks no interface for ::
		{"fd00::1", "fd00::2", "::%eth0", "six.test:7471"},
	} {
		t.Run(tc.local+"->"+tc.address, func(t *testing.T) {
			ctx := ctxT(t)
			f := newFabric(t)
			server, client := f.Node(tc.server), f.Node(tc.client)
			r := fakedns.Resolver(map[string][]netip.Addr{
				"four.test": {netip.MustParseAddr("10.1.0.1")},
				"six.test":  {netip.MustParseAddr("fd00::1")},
			})
			domain := func() Option { return WithDomainPath(filepath.Join(t.TempDir(), "xrc")) }
			l, err := Listen(ctx, netip.AddrPortFrom(server.Addr(), 7471).String(), WithFabric(server.Process()), domain())
			require.NoError(t, err)
			defer l.Close()
			c, err := Dial(ctx, tc.address, WithFabric(client.Process()), WithResolver(r), domain(), WithLocalAddr(tc.local))
			require.NoError(t, err)
			defer c.Close()
			s, err := l.Accept(ctx)
			require.NoError(t, err)
			defer s.Close()
			require.Equal(t, netip.AddrPortFrom(server.Addr(), 7471), c.RemoteAddr().(Addr).AddrPort)
			require.Equal(t, client.Addr(), s.RemoteAddr().(Addr).Addr(), "from the node's address")
		})
	}
}
