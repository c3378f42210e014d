//go:build linux && cgo

package integration

import (
	"net"
	"net/netip"
	"os"
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
func TestCMIPv6(t *testing.T) {
	dev, _ := softroce.Device(t)
	netdev := os.Getenv("RXE_NETDEV")
	require.NotEmpty(t, netdev, "RXE_NETDEV names the netdev under %s", dev)
	link, err := netlink.LinkByName(netdev)
	require.NoError(t, err)
	ip := netip.MustParseAddr("fd77::1")
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(64, 128)}, Flags: unix.IFA_F_NODAD}
	// Equivalent to: ip addr add fd77::1/64 dev $RXE_NETDEV nodad
	require.NoError(t, netlink.AddrAdd(link, addr))
	t.Cleanup(func() { netlink.AddrDel(link, addr) })

	// rxe adds the GID for the new address asynchronously.
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

	ctx := cmCtx(t, 20*time.Second)
	l, err := cm.Listen(ctx, netip.AddrPortFrom(ip, 0).String())
	require.NoError(t, err)
	defer l.Close()
	require.Contains(t, l.Addr().String(), "[fd77::1]:")
	accepted := make(chan *cm.Conn, 1)
	go func() {
		c, err := l.Accept(ctx)
		if err != nil {
			t.Error(err)
		}
		accepted <- c
	}()
	c, err := cm.Dial(ctx, l.Addr().String())
	require.NoError(t, err)
	defer c.Close()
	s := <-accepted
	require.NotNil(t, s)
	defer s.Close()
	require.NoError(t, c.Send(ctx, []byte("over IPv6")))
	buf := make([]byte, 32)
	n, err := s.Recv(ctx, buf)
	require.NoError(t, err)
	require.Equal(t, "over IPv6", string(buf[:n]))
	require.Equal(t, ip, c.RemoteAddr().(cm.Addr).Addr())
}
