package xrc

import (
	"errors"
	"fmt"
	"testing"
)

// An uplink whose recovery finds no leg to move leaves its TGT for the next
// dial's REPLACES_TGT (Endpoint.replaced), and only a new uplink to that
// node and domain took the entry away: a server whose peers crash on nodes
// that never come back (new addresses, as containers get) kept one entry
// per dead node for its whole life. Bounded as the addresses' domains are.
func TestReplacedTGTsBounded(t *testing.T) {
	defer func(n int) { maxAddrDoms = n }(maxAddrDoms)
	maxAddrDoms = 4
	w := newWorld(t)
	s := w.endpoint("10.0.173.1", 7000, longTimers)
	var last upKey
	for i := range 10 {
		r := w.endpoint(fmt.Sprintf("10.0.173.%d", 10+i), 7000, longTimers)
		c, _ := pair(t, s, r)
		r.p.Kill()
		if err := sendErr(t, c); !errors.Is(err, ErrPeerGone) {
			t.Fatalf("send to the dead receiver %d: %v, want ErrPeerGone", i, err)
		}
		eventually(t, "the uplink gone", func() (bool, string) {
			s.mu.Lock()
			defer s.mu.Unlock()
			return len(s.uplinks) == 0, fmt.Sprintf("%d uplinks", len(s.uplinks))
		})
		last = upKey{r.Addr().Addr(), r.dom.ID}
		c.Close()
	}
	s.mu.Lock()
	n := len(s.replaced)
	_, kept := s.replaced[last]
	s.mu.Unlock()
	if n > maxAddrDoms {
		t.Fatalf("s remembers the TGTs of %d dead uplinks, at most %d", n, maxAddrDoms)
	}
	if !kept {
		t.Fatal("the newest dead uplink's TGT was forgotten")
	}
}
