package cm

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestResolveAddrs(t *testing.T) {
	ctx := ctxT(t)
	for in, want := range map[string]string{
		"10.0.0.1:7471":       "10.0.0.1:7471",
		"[::ffff:10.0.0.1]:1": "10.0.0.1:1",
		"[fe80::1%lo]:7471":   "[fe80::1%lo]:7471",
		":7471":               "0.0.0.0:7471",
	} {
		as, err := resolveAddrs(ctx, in)
		require.NoError(t, err, in)
		require.Equal(t, []netip.AddrPort{netip.MustParseAddrPort(want)}, as, in)
	}
	as, err := resolveAddrs(ctx, "localhost:7471")
	require.NoError(t, err)
	require.NotEmpty(t, as)
	for _, a := range as {
		require.True(t, a.Addr().IsLoopback() && a.Port() == 7471, "%v", a)
	}
	for _, bad := range []string{"10.0.0.1", "10.0.0.1:port", "10.0.0.1:70000"} {
		_, err := resolveAddrs(ctx, bad)
		require.Error(t, err, bad)
	}
}

// A name's addresses are dialed in turn, each with a share of the time
// left, until one connects; with none, the first error is the answer.
func TestDialEachTriesAddressesInTurn(t *testing.T) {
	addrs := []netip.AddrPort{
		netip.MustParseAddrPort("[fd00::1]:1"), netip.MustParseAddrPort("10.0.0.1:1"), netip.MustParseAddrPort("10.0.0.2:1"),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var tried []netip.AddrPort
	var shares []time.Duration
	want := &Conn{}
	c, err := dialEach(ctx, addrs, func(ctx context.Context, a netip.AddrPort) (*Conn, error) {
		tried = append(tried, a)
		dl, _ := ctx.Deadline()
		shares = append(shares, time.Until(dl))
		if a == addrs[1] {
			return want, nil
		}
		return nil, errors.New("unreachable " + a.String())
	})
	require.NoError(t, err)
	require.Same(t, want, c)
	require.Equal(t, addrs[:2], tried, "stops at the first that connects")
	require.InDelta(t, 10*time.Second, shares[0], float64(time.Second), "a third of the time for the first of three")
	require.InDelta(t, 15*time.Second, shares[1], float64(time.Second), "half of what is left for the second of three")

	tried = nil
	_, err = dialEach(ctx, addrs, func(ctx context.Context, a netip.AddrPort) (*Conn, error) {
		tried = append(tried, a)
		return nil, errors.New("unreachable " + a.String())
	})
	require.EqualError(t, err, "unreachable [fd00::1]:1", "the first address's error")
	require.Equal(t, addrs, tried)

	// Little time left: each gets at least minDialShare of it; a
	// cancelled context stops the turns.
	short, cancelShort := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancelShort()
	tried = nil
	_, err = dialEach(short, addrs, func(ctx context.Context, a netip.AddrPort) (*Conn, error) {
		tried = append(tried, a)
		dl, _ := ctx.Deadline()
		require.InDelta(t, minDialShare, time.Until(dl), float64(200*time.Millisecond))
		cancelShort()
		return nil, ctx.Err()
	})
	require.Error(t, err)
	require.Len(t, tried, 1)
}
