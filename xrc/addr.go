package xrc

import (
	"net"
	"net/netip"
	"strconv"
)

// sameNode reports whether a and b name one node. The CM reports a
// link-local peer with its interface as the zone, QueryQP (the path's DGID)
// without one, and a dial names it as its caller wrote it (an interface
// name or index, or none; an IPv4 address perhaps in its IPv6-mapped form).
// Zones differ only where both are given.
func sameNode(a, b netip.Addr) bool {
	a, b = a.Unmap(), b.Unmap()
	if a.WithZone("") != b.WithZone("") {
		return false
	}
	za, zb := zoneName(a.Zone()), zoneName(b.Zone())
	return za == "" || zb == "" || za == zb
}

// canonicalAddr is ap in the form the CM reports peers in: IPv4 unmapped,
// a zone given as an interface index as the interface's name.
func canonicalAddr(ap netip.AddrPort) netip.AddrPort {
	a := ap.Addr().Unmap()
	if z := a.Zone(); z != "" {
		a = a.WithZone(zoneName(z))
	}
	return netip.AddrPortFrom(a, ap.Port())
}

func zoneName(z string) string {
	if i, err := strconv.Atoi(z); err == nil {
		if ifi, err := net.InterfaceByIndex(i); err == nil {
			return ifi.Name
		}
	}
	return z
}
