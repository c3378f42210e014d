package fakedns

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Names match whatever the case of their letters, as at a DNS server (RFC
// 4343): "Server.Test" is the table's "server.test". It was NXDOMAIN.
func TestResolverIgnoresCase(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v4 := netip.MustParseAddr("192.0.2.7")
	r := Resolver(map[string][]netip.Addr{"server.test": {v4}, "Mixed.Test": {v4}})
	for _, name := range []string{"Server.Test", "SERVER.TEST", "mixed.test", "Mixed.Test"} {
		got, err := r.LookupNetIP(ctx, "ip", name)
		require.NoError(t, err, name)
		require.Equal(t, []netip.Addr{v4}, got, name)
	}
}
