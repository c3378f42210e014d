package cm

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"

	"github.com/goxrc/goxrc/verbs"
)

// Addr is the address of an RDMA connection endpoint: an IP address and a
// port in the RDMA CM's TCP port space.
type Addr struct {
	netip.AddrPort
}

// Network returns "rdma".
func (a Addr) Network() string { return "rdma" }

var _ net.Addr = Addr{}

// resolveAddr parses "host:port", looking the host up when it is a name.
func resolveAddr(ctx context.Context, address string) (netip.AddrPort, error) {
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return netip.AddrPort{}, err
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("invalid port %q", port)
	}
	if host == "" {
		return netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(p)), nil
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		return netip.AddrPortFrom(ip.Unmap(), uint16(p)), nil
	}
	ips, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return netip.AddrPort{}, err
	}
	return netip.AddrPortFrom(ips[0].Unmap(), uint16(p)), nil
}

// deviceAddr returns an address of RDMA device name in the family of like:
// binding to it makes the CM use that device. It reads the device's GID
// table, where RoCE keeps the addresses of the netdevs under the device.
func deviceAddr(name string, like netip.Addr) (netip.Addr, error) {
	vctx, err := verbs.OpenDevice(name)
	if err != nil {
		return netip.Addr{}, err
	}
	defer vctx.Close()
	attr, err := vctx.QueryDevice()
	if err != nil {
		return netip.Addr{}, err
	}
	for port := 1; port <= attr.PhysPortCnt; port++ {
		gids, err := vctx.GIDs(uint8(port))
		if err != nil {
			continue
		}
		for _, g := range gids {
			ip := netip.AddrFrom16(g.GID).Unmap()
			if ip.IsUnspecified() || ip.IsLinkLocalUnicast() || ip.Is4() != like.Is4() {
				continue
			}
			return ip, nil
		}
	}
	family := "IPv6"
	if like.Is4() {
		family = "IPv4"
	}
	return netip.Addr{}, fmt.Errorf("device %s has no %s address", name, family)
}
