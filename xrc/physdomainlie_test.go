package xrc

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/xrc/internal/wire"
)

// A process in its own domain on a node (l), whose PHYS ACCEPT names the
// domain of an honest neighbour (h) instead of its own: the dialer's first
// contact with the node makes the uplink to l's TGT and keys it by h's
// domain. A dial to h then asks h to share l's TGT, which is in no domain
// of h's: TGT_GONE naming h's domain, the uplink's, so the dialer rebuilds
// it (onto l again, which answers the same) until the dial runs out of
// attempts. Every dial to h failed so, each after 17 rebuilds that move
// every leg on the uplink, for as long as the liar's connection held the
// uplink. Now a second refusal, onto the rebuilt TGT, refutes the uplink
// (uplink.refuted): the dial makes its own. Honest, l is answered
// DOMAIN_MISMATCH by h and the dial to h makes its own uplink (the control
// subtest).
func TestPhysAcceptClaimingNeighbourDomain(t *testing.T) {
	for _, lie := range []bool{false, true} {
		name := "honest"
		if lie {
			name = "lie"
		}
		t.Run(name, func(t *testing.T) {
			w := newWorld(t)
			a := w.endpoint("10.0.231.1", 7000)
			h := w.endpoint("10.0.231.2", 7000)
			var armed atomic.Bool
			armed.Store(lie)
			l := w.wrappedEndpoint("10.0.231.2", 7001, func(k kernel.Kernel) kernel.Kernel {
				return tamperAccept{k, &armed, func(acc *wire.Accept) { acc.DomainID = h.dom.ID }}
			}, func(c *Config) { c.DomainDir = t.TempDir() + "/other" })
			if l.dom.ID == h.dom.ID {
				t.Fatal("setup: l shares h's domain")
			}
			lc, err := a.Dial(ctxT(t, 5*time.Second), l.Addr().String())
			if err != nil {
				t.Fatalf("setup: dial to l: %v", err)
			}
			defer lc.Close()
			before := a.Stats()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			hc, err := a.Dial(ctx, h.Addr().String())
			if err != nil {
				t.Fatalf("dial to h, l's honest neighbour: %v (uplink rebuilds %d)", err, a.Stats().Recoveries-before.Recoveries)
			}
			hc.Close()
		})
	}
}
