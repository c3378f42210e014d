package cm

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
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
