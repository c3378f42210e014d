package rdmacm

import (
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"syscall"
)

// scopeID returns the IPv6 scope id (sin6_scope_id) of ip's zone: the index
// of the interface the zone names, by name ("eth0") or by number ("3"), as
// Go's net package reads zones. An address without a zone gives 0. The CM
// needs one to bind or reach a link-local address (fe80::/10), which every
// RoCE port has: the kernel refuses to bind one without it.
func scopeID(ip netip.Addr) (uint32, error) {
	zone := ip.Zone()
	if zone == "" {
		return 0, nil
	}
	if n, err := strconv.ParseUint(zone, 10, 32); err == nil {
		return uint32(n), nil
	}
	ifi, err := net.InterfaceByName(zone)
	if err != nil {
		return 0, fmt.Errorf("zone %q of %v: %w", zone, ip.WithZone(""), err)
	}
	return uint32(ifi.Index), nil
}

// withZone gives ip the zone of scope id (0: none): the interface's name,
// or the number where no interface has that index (any more), so that the
// address prints as the one a caller would pass back.
func withZone(ip netip.Addr, scope uint32) netip.Addr {
	if scope == 0 || ip.Is4() {
		return ip
	}
	if ifi, err := net.InterfaceByIndex(int(scope)); err == nil {
		return ip.WithZone(ifi.Name)
	}
	return ip.WithZone(strconv.FormatUint(uint64(scope), 10))
}

// CanonicalZone returns ip with a zone given as an interface index ("%3")
// as the interface's name ("%eth0"), the form the CM reports addresses in;
// any other address as it is.
func CanonicalZone(ip netip.Addr) netip.Addr {
	n, err := strconv.ParseUint(ip.Zone(), 10, 32)
	if err != nil || n == 0 {
		return ip
	}
	return withZone(ip, uint32(n))
}

// checkBindZone explains what the kernel's EINVAL does not: binding an
// IPv6 link-local address needs the zone naming its interface.
func checkBindZone(ip netip.Addr) error {
	if ip.Is6() && !ip.Is4In6() && ip.IsLinkLocalUnicast() && ip.Zone() == "" {
		return fmt.Errorf("%w: the link-local address %v needs its interface as a zone, as in %v", syscall.EINVAL, ip, ip.WithZone("eth0"))
	}
	return nil
}
