package xrc

import (
	"net/netip"
	"strings"

	"github.com/goxrc/goxrc/rdmacm"
)

// sameNode reports whether a and b name one node. The CM reports a
// link-local peer with its interface as the zone, QueryQP (the path's DGID)
// without one, and a dial names it as its caller wrote it (an interface
// name or index, or none; an IPv4 address perhaps in its IPv6-mapped form).
// Zones differ only where both are given.
func sameNode(a, b netip.Addr) bool {
	a, b = rdmacm.CanonicalZone(a.Unmap()), rdmacm.CanonicalZone(b.Unmap())
	if a.WithZone("") != b.WithZone("") {
		return false
	}
	return a.Zone() == "" || b.Zone() == "" || a.Zone() == b.Zone()
}

// parseListenAddr parses a Config.Addr. An empty ip (":7000") is IPv4's
// unspecified address, as for net.Listen and cm.Listen.
func parseListenAddr(s string) (netip.AddrPort, error) {
	if strings.HasPrefix(s, ":") {
		s = "0.0.0.0" + s
	}
	return netip.ParseAddrPort(s)
}

// canonicalAddr is ap in the form the CM reports peers in: IPv4 unmapped,
// a zone given as an interface index as the interface's name.
func canonicalAddr(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(rdmacm.CanonicalZone(ap.Addr().Unmap()), ap.Port())
}

// nodeKey is ap as a key of the endpoint's maps by address: without a
// zone, which names the one link an endpoint's device is on (see sameNode).
func nodeKey(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap().WithZone(""), ap.Port())
}

// maxAddrDoms bounds what an endpoint remembers of addresses' domains: one
// entry per peer process (a server's clients come and go on new ports). An
// address forgotten costs its next connection one more exchange, which
// learns it again. It bounds the dead uplinks' TGTs kept for REPLACES_TGT
// too (Endpoint.replaced).
var maxAddrDoms = 4096 // a variable for tests

func (e *Endpoint) domainOfLocked(ap netip.AddrPort) uint64 { return e.addrDom[nodeKey(ap)] }

// learnDomainLocked records that ap is in domain dom, forgetting the oldest
// address learned when maxAddrDoms are known.
func (e *Endpoint) learnDomainLocked(ap netip.AddrPort, dom uint64) {
	k := nodeKey(ap)
	if _, ok := e.addrDom[k]; !ok {
		if len(e.addrOrder) >= maxAddrDoms {
			delete(e.addrDom, e.addrOrder[0])
			e.addrOrder = append(e.addrOrder[:0], e.addrOrder[1:]...)
		}
		e.addrOrder = append(e.addrOrder, k)
	}
	e.addrDom[k] = dom
}
