package fakedns

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestResolverAnswersFromItsTable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	v4, v6 := netip.MustParseAddr("192.0.2.7"), netip.MustParseAddr("2001:db8::7")
	r := Resolver(map[string][]netip.Addr{"both.test": {v4, v6}, "four.test": {v4}})

	got, err := r.LookupNetIP(ctx, "ip", "both.test")
	require.NoError(t, err)
	require.ElementsMatch(t, []netip.Addr{v4, v6}, got)

	got, err = r.LookupNetIP(ctx, "ip6", "both.test")
	require.NoError(t, err)
	require.Equal(t, []netip.Addr{v6}, got)

	got, err = r.LookupNetIP(ctx, "ip", "four.test")
	require.NoError(t, err)
	require.Equal(t, []netip.Addr{v4}, got)

	_, err = r.LookupNetIP(ctx, "ip", "unknown.test")
	var dnsErr *net.DNSError
	require.True(t, errors.As(err, &dnsErr), "%v", err)
	require.True(t, dnsErr.IsNotFound, "%v", err)
}
