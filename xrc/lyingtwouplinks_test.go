package xrc

import (
	"context"
	"errors"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/xrc/internal/wire"
)

// The liar of TestEndpointLyingTGTGoneBounded on a node where we have two
// uplinks, one per domain (b's and c's), answering each request once both
// are up and settled. The dial remembered only the last uplink it rebuilt,
// so where it rode them by turns it rebuilt each again and again: with the
// liar's domain never learned, each request rode whichever uplink was up
// (the other recovering from the last rebuild), free of attempts, every leg
// on both moved once a round trip until the dial's deadline; with
// DOMAIN_MISMATCH naming the other domain between its TGT_GONEs, one
// rebuild for each attempt (15). A dial rebuilds each uplink once: two
// rebuilds here, then both are refuted and the dial fails.
func TestEndpointLyingTGTGoneTwoUplinksBounded(t *testing.T) {
	for _, byTurns := range []bool{false, true} {
		name := "TGT_GONE"
		if byTurns {
			name = "DOMAIN_MISMATCH by turns"
		}
		t.Run(name, func(t *testing.T) {
			w := newWorld(t)
			const node = "10.0.241.2"
			a := w.endpoint("10.0.241.1", 7000)
			b := w.endpoint(node, 7000)
			c := w.endpoint(node, 7001, func(cfg *Config) { cfg.DomainDir = t.TempDir() + "/other" })
			if b.dom.ID == c.dom.ID {
				t.Fatal("setup: c shares b's domain")
			}
			ab, ba := pair(t, a, b)
			ac, ca := pair(t, a, c)
			if n, _ := liveUplinks(a.Endpoint, node); n != 2 {
				t.Fatalf("setup: %d uplinks to %s, want one per domain", n, node)
			}
			// settled waits until a's uplinks are up, none recovering.
			settled := func(ctx context.Context) {
				for {
					a.mu.Lock()
					var ch chan struct{}
					for _, u := range a.uplinks {
						if u.state != upNone && (u.state != upUp || u.settling) {
							ch = u.changed
						}
					}
					a.mu.Unlock()
					if ch == nil {
						return
					}
					select {
					case <-ch:
					case <-ctx.Done():
						return
					}
				}
			}
			liar := netip.MustParseAddrPort(node + ":7100")
			k := w.rawKernel(node)
			l, err := k.Listen(liar, kernel.ExchangeSIDR)
			if err != nil {
				t.Fatal(err)
			}
			lctx, stop := context.WithCancel(context.Background())
			defer stop()
			var rejects atomic.Int32
			go func() {
				for {
					ev, err := k.Event(lctx, l)
					if err != nil {
						return
					}
					var req wire.Req
					if wire.DecodeReq(ev.PrivateData, wire.TypeVirtReq, &req) == nil {
						settled(lctx)
						rj := wire.Reject{Tag: req.ConnTag, Reason: wire.RejectTGTGone, MinVersion: 2, MaxVersion: 2, DomainID: req.DomainHint}
						if rejects.Add(1)%2 == 1 && byTurns {
							rj.Reason, rj.DomainID = wire.RejectDomainMismatch, b.dom.ID^c.dom.ID^req.DomainHint
						}
						pd := make([]byte, wire.BudgetSIDRREP)
						n, _ := rj.Encode(pd)
						k.Reject(ev.ID, pd[:n])
					}
					k.DestroyID(ev.ID)
				}
			}()
			before := a.Stats().Recoveries
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err = a.Dial(ctx, liar.String())
			cancel()
			rebuilds := a.Stats().Recoveries - before
			t.Logf("dial: %v; %d rejects, %d rebuilds", err, rejects.Load(), rebuilds)
			if err == nil || errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("dial to the liar: %v after %d rebuilds, want it to fail before its ctx ends", err, rebuilds)
			}
			if rebuilds > 2 {
				t.Fatalf("%d rebuilds of the two uplinks for one dial, want at most one each", rebuilds)
			}
			roundTrip(t, ab, ba, []byte("b still up"))
			roundTrip(t, ac, ca, []byte("c still up"))
		})
	}
}
