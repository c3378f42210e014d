package xrc

import (
	"math/rand/v2"
	"net/netip"
	"testing"
)

// linksInUse, the janitor's one pass, answers what onLink over every held
// downlink answers, link by link: on random downlinks whose numbers,
// incarnations and nodes collide often, creators and TGTs opened again.
func TestLinksInUseMatchesOnLink(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	nodes := []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("fe80::1%1"), netip.MustParseAddr("fe80::1")}
	random := func() *downlink {
		return &downlink{TGTQPN: 2 + r.Uint32N(3), INIQPN: 2 + r.Uint32N(3), Incarnation: 1 + r.Uint64N(2),
			Remote: nodes[r.IntN(len(nodes))], Creator: r.IntN(2) == 0}
	}
	for range 500 {
		var links []*downlink
		held := map[*downlink]struct{}{}
		for range r.IntN(8) {
			dl := random()
			dl.Creator = true // a link's downlink is the TGT it made
			links = append(links, dl)
			if r.IntN(3) == 0 {
				held[dl] = struct{}{}
			}
		}
		for range r.IntN(12) {
			held[random()] = struct{}{}
		}
		got := linksInUse(links, held)
		for i, dl := range links {
			want := false
			for o := range held {
				want = want || onLink(o, dl)
			}
			if got[i] != want {
				t.Fatalf("link %+v among %d held downlinks: in use %v, want %v", *dl, len(held), got[i], want)
			}
		}
	}
}
