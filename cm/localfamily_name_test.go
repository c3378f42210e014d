package cm

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/internal/fakedns"
)

// A name that has addresses, none of WithLocalAddr's family, exists: Dial
// fails with "no suitable address found", as net.Dialer does with such a
// LocalAddr (it looks up the network's families and then skips the
// addresses the local one cannot reach). Dial looked the name up in the
// local address's family only, and said "no such host": a *net.DNSError
// with IsNotFound, which tells a caller (and a negative cache) the name
// does not exist.
func TestDialLocalAddrNameOfOtherFamilyExists(t *testing.T) {
	ctx := ctxT(t)
	r := fakedns.Resolver(map[string][]netip.Addr{
		"six.test":  {netip.MustParseAddr("fd00::1")},
		"four.test": {netip.MustParseAddr("10.1.0.1")},
	})

	// What net.Dialer says (it fails before it connects anything).
	nd := net.Dialer{Resolver: r, LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.1")}}
	_, nerr := nd.DialContext(ctx, "tcp", "six.test:7471")
	var nae *net.AddrError
	require.ErrorAs(t, nerr, &nae, "net.Dialer: %v", nerr)
	require.Equal(t, "no suitable address found", nae.Err)

	for _, tc := range []struct{ client, local, address, listen string }{
		{"10.1.0.2", "10.1.0.2", "six.test:7471", "[fd00::1]:7471"},
		{"fd00::2", "fd00::2", "four.test:7471", "10.1.0.1:7471"},
		{"10.1.0.2", "::ffff:10.1.0.2", "six.test:7471", "[fd00::1]:7471"},
	} {
		t.Run(tc.local+"->"+tc.address, func(t *testing.T) {
			f := newFabric(t)
			server := f.Node(netip.MustParseAddrPort(tc.listen).Addr().String())
			l, err := Listen(ctx, tc.listen, WithFabric(server.Process()), WithDomainPath(filepath.Join(t.TempDir(), "s")))
			require.NoError(t, err)
			defer l.Close()
			c, err := Dial(ctx, tc.address, WithFabric(f.Node(tc.client).Process()), WithResolver(r),
				WithLocalAddr(tc.local), WithDomainPath(filepath.Join(t.TempDir(), "c")))
			if c != nil {
				c.Close()
				t.Fatal("dialed across families")
			}
			var dnsErr *net.DNSError
			require.False(t, errors.As(err, &dnsErr), "the name exists: %v", err)
			var ae *net.AddrError
			require.ErrorAs(t, err, &ae, "%v", err)
			require.Equal(t, "no suitable address found", ae.Err)
			require.False(t, errors.Is(err, context.DeadlineExceeded))
		})
	}
}
