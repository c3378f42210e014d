//go:build linux && cgo

package integration

import (
	"errors"
	"net"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/goxrc/goxrc/cm"
	"github.com/goxrc/goxrc/test/softroce"
	"github.com/goxrc/goxrc/verbs"
)

// TestCMIPv6 gives the rxe netdev an IPv6 address (rxe turns it into a GID)
// and connects to it by [ip]:port.
//
// The address stays, as softroce.SecondAddress's does, for the reason given
// there: the kernel's CM may still send from it after the test, and a CM
// message sent from an address whose GID is gone leaves soft-RoCE's QP1
// receiving nothing for good (kernel 6.1; docs/kernel-findings.md).
func TestCMIPv6(t *testing.T) {
	dev, v4 := softroce.Device(t)
	netdev := os.Getenv("RXE_NETDEV")
	require.NotEmpty(t, netdev, "RXE_NETDEV names the netdev under %s", dev)
	link, err := netlink.LinkByName(netdev)
	require.NoError(t, err)
	ip := ipv6Beside(v4)
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD}
	// Equivalent to: ip addr add fd77:a:4d::1/64 dev $RXE_NETDEV nodad
	// (for RXE_IP 10.77.0.1); there already if an earlier run added it.
	if err := netlink.AddrAdd(link, addr); !errors.Is(err, unix.EEXIST) {
		require.NoError(t, err)
	}

	awaitGID(t, dev, ip)

	ctx := cmCtx(t, 20*time.Second)
	l, err := cm.Listen(ctx, netip.AddrPortFrom(ip, 0).String())
	require.NoError(t, err)
	defer l.Close()
	require.Contains(t, l.Addr().String(), "["+ip.String()+"]:")
	c, s := dialAccepted(t, ctx, l)
	require.Equal(t, ip, c.RemoteAddr().(cm.Addr).Addr())
	requireBothWays(t, c, s)
}

// TestCMIPv6LinkLocal connects by the rxe netdev's link-local address, which
// every RoCE port has (its first GID), named with its zone as in net.Dial:
// [fe80::...%veth0]:port.
func TestCMIPv6LinkLocal(t *testing.T) {
	softroce.Device(t)
	netdev := os.Getenv("RXE_NETDEV")
	require.NotEmpty(t, netdev, "RXE_NETDEV names the rxe device's netdev")
	ll := linkLocal(t, netdev)
	zoned := ll.WithZone(netdev)

	ctx := cmCtx(t, 20*time.Second)
	l, err := cm.Listen(ctx, netip.AddrPortFrom(zoned, 0).String())
	require.NoError(t, err)
	defer l.Close()
	la := l.Addr().(cm.Addr)
	require.Equal(t, zoned, la.Addr(), "the listener reports the zone it was given")
	accepted := acceptOne(t, ctx, l)

	c, err := cm.Dial(ctx, la.String())
	require.NoError(t, err)
	defer c.Close()
	s := <-accepted
	require.NotNil(t, s)
	defer s.Close()
	require.Equal(t, la, c.RemoteAddr(), "the dialer's peer is the address it dialed, zone and all")
	require.Equal(t, la, s.LocalAddr())
	for _, a := range []net.Addr{c.LocalAddr(), s.RemoteAddr()} {
		require.Equal(t, zoned, a.(cm.Addr).Addr(), "%v: the link-local address with its zone", a)
	}
	requireBothWays(t, c, s)

	// WithDevice and a zoned link-local peer: the zone picks the
	// interface (the dial bound the device's IPv6 address, and failed
	// where it has only its link-local one).
	dev, _ := softroce.Device(t)
	accepted = acceptOne(t, ctx, l)
	c2, err := cm.Dial(ctx, la.String(), cm.WithDevice(dev))
	require.NoError(t, err)
	defer c2.Close() // requireBothWays closes both; this on a failure
	s2 := <-accepted
	require.NotNil(t, s2)
	defer s2.Close()
	requireBothWays(t, c2, s2)

	// A listener on the unspecified address: the kernel does not say
	// which interface a connection came in on; the GID table does (the
	// connection's addresses had no zone).
	lu, err := cm.Listen(ctx, "[::]:0")
	require.NoError(t, err)
	defer lu.Close()
	accepted = acceptOne(t, ctx, lu)
	c3, err := cm.Dial(ctx, netip.AddrPortFrom(zoned, lu.Addr().(cm.Addr).Port()).String())
	require.NoError(t, err)
	defer c3.Close()
	s3 := <-accepted
	require.NotNil(t, s3)
	defer s3.Close()
	t.Logf("on [::]: local %v, remote %v", s3.LocalAddr(), s3.RemoteAddr())
	require.Equal(t, zoned, s3.LocalAddr().(cm.Addr).Addr(), "the address the dialer reached, with its zone")
	require.Equal(t, zoned, s3.RemoteAddr().(cm.Addr).Addr(), "the dialer's address, with its zone")
	requireBothWays(t, c3, s3)
	// So the peer can be dialed back by what RemoteAddr says.
	accepted = acceptOne(t, ctx, l)
	c4, err := cm.Dial(ctx, netip.AddrPortFrom(s3.RemoteAddr().(cm.Addr).Addr(), la.Port()).String())
	require.NoError(t, err)
	defer c4.Close() // requireBothWays closes both; this on a failure
	s4 := <-accepted
	require.NotNil(t, s4)
	defer s4.Close()
	requireBothWays(t, c4, s4)

	// Without its zone a link-local address names no interface to bind.
	err = failureOf(cm.Listen(ctx, netip.AddrPortFrom(ll, 0).String()))
	require.ErrorIs(t, err, syscall.EINVAL)
	require.ErrorContains(t, err, "needs its interface as a zone")
	err = failureOf(cm.Dial(ctx, netip.AddrPortFrom(ll.WithZone("no-such-if0"), la.Port()).String()))
	require.ErrorContains(t, err, `zone "no-such-if0"`)
}

// awaitGID waits until RDMA device dev has a GID for IPv6 address ip, which
// rxe adds a moment after the address appears on its netdev.
func awaitGID(t *testing.T, dev string, ip netip.Addr) {
	t.Helper()
	vctx, err := verbs.OpenDevice(dev)
	require.NoError(t, err)
	defer vctx.Close()
	require.Eventually(t, func() bool {
		gids, err := vctx.GIDs(1)
		if err != nil {
			return false
		}
		for _, g := range gids {
			if netip.AddrFrom16(g.GID) == ip {
				return true
			}
		}
		return false
	}, 10*time.Second, 50*time.Millisecond, "no GID for %s on %s", ip, dev)
}

// ipv6Beside returns the IPv6 address TestCMIPv6 gives the netdev of IPv4
// address v4 (a.b.c.d): fd77:a:b:c::d, a /64 of its own for each device the
// guest's test binaries run on (rxe0, and the -race build's beside it).
func ipv6Beside(v4 netip.Addr) netip.Addr {
	b := v4.As4()
	return netip.AddrFrom16([16]byte{0xfd, 0x77, 0, b[0], 0, b[1], 0, b[2], 15: b[3]})
}

// linkLocal returns netdev's IPv6 link-local address once duplicate address
// detection is done with it (a tentative address cannot be bound).
func linkLocal(t *testing.T, netdev string) netip.Addr {
	t.Helper()
	link, err := netlink.LinkByName(netdev)
	require.NoError(t, err)
	var ll netip.Addr
	require.Eventually(t, func() bool {
		// Equivalent to: ip -6 addr show dev $netdev scope link
		addrs, err := netlink.AddrList(link, netlink.FAMILY_V6)
		if err != nil {
			return false
		}
		for _, a := range addrs {
			ip, ok := netip.AddrFromSlice(a.IP)
			if ok && ip.IsLinkLocalUnicast() && a.Flags&unix.IFA_F_TENTATIVE == 0 {
				ll = ip
				return true
			}
		}
		return false
	}, 10*time.Second, 50*time.Millisecond, "%s has no IPv6 link-local address out of duplicate address detection", netdev)
	return ll
}

// linkLocalVeth carries the soft-RoCE device of TestCMListenDeviceLinkLocalOnly,
// whose netdev must have no IPv6 address but its link-local one: a pair of
// its own, since rxe0's netdev keeps TestCMIPv6's.
var linkLocalVeth = testVeth("vethll", 85)

const linkLocalDev = "rxell0"

// TestCMListenDeviceLinkLocalOnly: WithDevice and "[::]:port" listen on the
// device's IPv6 address; where its netdev has only its link-local one, the
// error names that address with its zone, and listening on it works.
func TestCMListenDeviceLinkLocalOnly(t *testing.T) {
	softroce.Device(t) // skips off the VM
	_, err := softroce.Setup(linkLocalDev, linkLocalVeth)
	require.NoError(t, err)
	netdev := linkLocalVeth.Name
	ll := linkLocal(t, netdev)
	awaitGID(t, linkLocalDev, ll)
	zoned := ll.WithZone(netdev)
	ctx := cmCtx(t, 20*time.Second)
	err = failureOf(cm.Listen(ctx, "[::]:0", cm.WithDevice(linkLocalDev)))
	require.ErrorContains(t, err, "has no IPv6 address but its link-local one, "+zoned.String())
	l, err := cm.Listen(ctx, netip.AddrPortFrom(zoned, 0).String(), cm.WithDevice(linkLocalDev))
	require.NoError(t, err)
	defer l.Close()
	c, s := dialAccepted(t, ctx, l)
	requireBothWays(t, c, s)
}
