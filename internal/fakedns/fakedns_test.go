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

// An IPv4-mapped address in the table is an AAAA record, as a real server
// may hold one, and comes back as it is (16 bytes): the resolver's callers
// must unmap it. It was answered in neither A nor AAAA queries, so a name
// with only such addresses was not found.
func TestResolverAnswersMappedAddress(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	mapped := netip.MustParseAddr("::ffff:192.0.2.7")
	r := Resolver(map[string][]netip.Addr{"mapped.test": {mapped}})

	got, err := r.LookupNetIP(ctx, "ip", "mapped.test")
	require.NoError(t, err)
	require.Equal(t, []netip.Addr{mapped}, got)

	_, err = r.LookupNetIP(ctx, "ip4", "mapped.test")
	var dnsErr *net.DNSError
	require.True(t, errors.As(err, &dnsErr), "an AAAA record only: %v", err)
	require.True(t, dnsErr.IsNotFound, "%v", err)
}
