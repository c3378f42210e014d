//go:build linux && cgo

package kcm

import (
	"net/netip"
	"testing"
	"time"
)

// Spares too old to use give their slots back when the table is full: a
// spare for a destination never dialled again used to hold its slot (and
// its CM id) until Close, and with maxSpares of them no new destination got
// a spare again. Spares still resolving, and fresh ones, stay.
func TestReapSparesFreesOldSlots(t *testing.T) {
	c := &CM{spares: map[netip.AddrPort]*spare{}}
	dst := func(i int) netip.AddrPort {
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 1, byte(i >> 8), byte(i)}), 7)
	}
	for i := range maxSpares - 2 {
		c.spares[dst(i)] = &spare{done: make(chan struct{}), ready: time.Now().Add(-time.Hour)}
	}
	resolving, fresh := dst(1000), dst(1001)
	c.spares[resolving] = &spare{done: make(chan struct{})}
	c.spares[fresh] = &spare{done: make(chan struct{}), ready: time.Now()}
	c.reapSparesLocked()
	if len(c.spares) != 2 || c.spares[resolving] == nil || c.spares[fresh] == nil {
		t.Fatalf("after reaping: %d spares %v, want the resolving and the fresh one", len(c.spares), c.spares)
	}
}
