//go:build linux && cgo

package rdmacm

import (
	"net"
	"net/netip"
	"strconv"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestZonesBecomeScopeIDsAndBack(t *testing.T) {
	lo, err := net.InterfaceByName("lo")
	require.NoError(t, err)
	unused := uint32(1<<31 - 1)
	_, err = net.InterfaceByIndex(int(unused))
	require.Error(t, err, "an interface with index %d", unused)

	for _, tc := range []struct {
		in    string
		scope uint32
		out   string // what comes back from the kernel's sockaddr
	}{
		{"[fe80::1%lo]:7000", uint32(lo.Index), "[fe80::1%lo]:7000"},
		{"[fe80::1%" + strconv.Itoa(lo.Index) + "]:7000", uint32(lo.Index), "[fe80::1%lo]:7000"},
		{"[fe80::1%2147483647]:1", unused, "[fe80::1%2147483647]:1"},
		{"[fe80::1]:7000", 0, "[fe80::1]:7000"},
		{"[fd77::1]:7000", 0, "[fd77::1]:7000"},
		{"10.0.0.1:7000", 0, "10.0.0.1:7000"},
	} {
		a := netip.MustParseAddrPort(tc.in)
		g, err := toC(a)
		require.NoError(t, err, tc.in)
		require.EqualValues(t, tc.scope, g.scope, tc.in)
		require.Equal(t, tc.out, fromC(&g).String(), tc.in)
	}
}

func TestUnknownZoneIsAClearError(t *testing.T) {
	a := netip.MustParseAddrPort("[fe80::1%no-such-if0]:7000")
	_, err := toC(a)
	require.Error(t, err)
	require.Contains(t, err.Error(), `zone "no-such-if0" of fe80::1`)
	var opErr *net.OpError
	require.ErrorAs(t, err, &opErr, "the net package's lookup error stays matchable")
}

func TestBindingLinkLocalWithoutZoneIsExplained(t *testing.T) {
	err := checkBindZone(netip.MustParseAddr("fe80::1"))
	require.ErrorIs(t, err, syscall.EINVAL)
	require.ErrorContains(t, err, "fe80::1 needs its interface as a zone, as in fe80::1%eth0")
	for _, ok := range []string{"fe80::1%lo", "fd77::1", "169.254.1.1", "::ffff:169.254.1.1", "::"} {
		require.NoError(t, checkBindZone(netip.MustParseAddr(ok)), ok)
	}
}

func TestCanonicalZone(t *testing.T) {
	for in, want := range map[string]string{
		"fe80::1%1":    "fe80::1%lo", // lo is index 1 on Linux
		"fe80::1%lo":   "fe80::1%lo",
		"fe80::1":      "fe80::1",
		"10.0.0.1":     "10.0.0.1",
		"fe80::1%9999": "fe80::1%9999", // no such interface: kept
	} {
		if got := CanonicalZone(netip.MustParseAddr(in)).String(); got != want {
			t.Errorf("CanonicalZone(%s) = %s, want %s", in, got, want)
		}
	}
}
