package cm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"

	"github.com/goxrc/goxrc/rdmacm"
)

// Addr is the address of an RDMA connection endpoint: an IP address and a
// port number of the RDMA CM's, in its TCP port space (RDMA_PS_TCP) for RC
// connections and in its IB and UDP spaces for XRC ones (see the package
// doc).
type Addr struct {
	netip.AddrPort
}

// Network returns "rdma".
func (a Addr) Network() string { return "rdma" }

var _ net.Addr = Addr{}

// resolveAddr parses "host:port", looking the host up with r (nil: the
// default resolver) when it is a name: its first address.
func resolveAddr(ctx context.Context, r *net.Resolver, address string) (netip.AddrPort, error) {
	as, err := resolveAddrs(ctx, r, "ip", address)
	if err != nil {
		return netip.AddrPort{}, err
	}
	return as[0], nil
}

// unparsable makes the *net.AddrError of an address that does not parse (a
// port out of range included) match ErrInvalid as well, as the package doc
// says; other errors, a service name nobody knows, stay as they are.
func unparsable(err error) error {
	var ae *net.AddrError
	if errors.As(err, &ae) {
		return fmt.Errorf("%w (%w)", err, ErrInvalid)
	}
	return err
}

// resolveAddrs parses "host:port", looking the host up with r (nil: the
// default resolver) when it is a name: every address of family ("ip":
// either, "ip4" or "ip6"), in the resolver's order. An empty host is the
// unspecified address of family, IPv4's for "ip". A port may be a service
// name ("http"), as for net.Dial. An IPv6 zone is kept, an interface index
// as the interface's name, the form the RDMA CM reports addresses in.
func resolveAddrs(ctx context.Context, r *net.Resolver, family, address string) ([]netip.AddrPort, error) {
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return nil, unparsable(err)
	}
	if r == nil {
		r = net.DefaultResolver
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		if port == "" {
			return nil, unparsable(&net.AddrError{Err: "missing port in address", Addr: address})
		}
		n, lerr := r.LookupPort(ctx, "tcp", port)
		if lerr != nil {
			return nil, unparsable(fmt.Errorf("invalid port %q: %w", port, lerr))
		}
		p = uint64(n)
	}
	var ips []netip.Addr
	switch ip, perr := netip.ParseAddr(host); {
	case host == "" && family == "ip6":
		ips = []netip.Addr{netip.IPv6Unspecified()}
	case host == "":
		ips = []netip.Addr{netip.IPv4Unspecified()}
	case perr == nil:
		ips = []netip.Addr{ip}
	default:
		if ips, err = r.LookupNetIP(ctx, family, host); err != nil {
			return nil, err
		}
	}
	as := make([]netip.AddrPort, 0, len(ips))
	for _, ip := range ips {
		ip = rdmacm.CanonicalZone(ip.Unmap())
		if family == "ip4" && !ip.Is4() || family == "ip6" && !ip.Is6() {
			continue
		}
		a := netip.AddrPortFrom(ip, uint16(p))
		if !slices.Contains(as, a) {
			as = append(as, a)
		}
	}
	if len(as) == 0 {
		return nil, &net.AddrError{Err: "no suitable address found", Addr: host}
	}
	return as, nil
}

// reachableFrom keeps the addresses of dsts (those resolveAddrs found for
// address) of local's family, and an unspecified one, which dial refuses
// with its own error, as net.Dialer keeps a wildcard address whatever its
// LocalAddr. With none left: "no suitable address found", as for a
// literal of the other family.
func reachableFrom(dsts []netip.AddrPort, local netip.Addr, address string) ([]netip.AddrPort, error) {
	var keep []netip.AddrPort
	for _, a := range dsts {
		if a.Addr().Is4() == local.Is4() || a.Addr().WithZone("").IsUnspecified() {
			keep = append(keep, a)
		}
	}
	if len(keep) == 0 {
		host, _, _ := net.SplitHostPort(address) // resolveAddrs parsed it
		return nil, &net.AddrError{Err: "no suitable address found", Addr: host}
	}
	return keep, nil
}
