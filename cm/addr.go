package cm

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
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

// resolveAddr parses "host:port", looking the host up with r (nil: the
// default resolver) when it is a name: its first address.
func resolveAddr(ctx context.Context, r *net.Resolver, address string) (netip.AddrPort, error) {
	as, err := resolveAddrs(ctx, r, address)
	if err != nil {
		return netip.AddrPort{}, err
	}
	return as[0], nil
}

// resolveAddrs parses "host:port", looking the host up with r (nil: the
// default resolver) when it is a name: every address, in the resolver's
// order. An IPv6 zone is kept.
func resolveAddrs(ctx context.Context, r *net.Resolver, address string) ([]netip.AddrPort, error) {
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return nil, err
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("invalid port %q", port)
	}
	if host == "" {
		return []netip.AddrPort{netip.AddrPortFrom(netip.IPv4Unspecified(), uint16(p))}, nil
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		return []netip.AddrPort{netip.AddrPortFrom(ip.Unmap(), uint16(p))}, nil
	}
	if r == nil {
		r = net.DefaultResolver
	}
	ips, err := r.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil, err
	}
	as := make([]netip.AddrPort, 0, len(ips))
	for _, ip := range ips {
		a := netip.AddrPortFrom(ip.Unmap(), uint16(p))
		if !slices.Contains(as, a) {
			as = append(as, a)
		}
	}
	return as, nil
}
