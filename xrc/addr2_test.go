package xrc

import (
	"fmt"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// The TGT creator's passive link outlives its own handle on the TGT when
// another process of its node keeps the TGT alive; the sender's next leg to
// the creator re-opens the same TGT by number (a new *downlink). When the
// sender dies, the old link's DREQ ends that leg too (keyed by the link's own
// downlink alone, it waited for the idle timeout).
func TestEndpointDREQEndsLegOnReopenedDownlink(t *testing.T) {
	w := newWorld(t)
	slowIdle := longTimers
	s := w.endpoint("10.0.64.1", 7000, longTimers)
	r1 := w.endpoint("10.0.64.2", 7000, slowIdle)
	r2 := w.endpoint("10.0.64.2", 7001, slowIdle)
	links := func() int {
		r1.mu.Lock()
		defer r1.mu.Unlock()
		return len(r1.passive)
	}
	c1, d1 := pair(t, s, r1) // PHYS: r1 creates the TGT, its passive link
	_, _ = pair(t, s, r2)    // VIRT: r2 opens the same TGT by number
	s.mu.Lock()
	tgt := s.uplinks[0].cur.tgt
	s.mu.Unlock()
	c1.Close()
	d1.Close()
	eventually(t, "r1's handle on the TGT released", func() (bool, string) {
		st := r1.Stats()
		return st.Downlinks == 0 && st.Conns == 0, fmt.Sprintf("%+v", st)
	})
	if n := links(); n != 1 {
		t.Fatalf("setup: r1 holds %d physical links, want s's", n)
	}
	_, d3 := pair(t, s, r1) // VIRT: r1 re-opens the TGT by number
	if got := r1.acc.LocalCount(tgt); got != 1 {
		t.Fatalf("setup: r1's count on TGT %#x is %d, want 1 (re-opened)", tgt, got)
	}
	s.p.Kill() // its INI's CM id sends the DREQ to r1's link
	eventually(t, "r1's watcher of s's link took its DREQ and ended", func() (bool, string) {
		n := links()
		return n == 0, fmt.Sprint(n, " physical links")
	})
	r1.mu.Lock()
	gone, err := !d3.goneAt.IsZero(), d3.err
	r1.mu.Unlock()
	if !gone {
		t.Fatalf("the DREQ on s's link did not mark r1's connection from s gone (err %v): it waits for the idle timeout", err)
	}
}

// One uplink per remote node and domain, whatever form a dial names a
// link-local peer in: the CM reports the peer with its interface as the
// zone, and a dial may name it without one (sameNode accepts both). A's
// dial to B without a zone, then B's dial to A without a zone: B's reverse
// leg of the first made B's uplink to "fe80::1%lo", its own dial looked for
// "fe80::1" (uplinkForLocked compared exactly) and made a second INI; A
// likewise for B's reverse leg.
func TestAddrZonelessDialSharesUplink(t *testing.T) {
	for _, zone := range []string{"%lo", ""} {
		t.Run("zone="+zone, func(t *testing.T) {
			w := newWorld(t)
			wrap := func(k kernel.Kernel) kernel.Kernel { return linkLocalCM{k} }
			a := w.wrappedEndpoint("fe80::1", 7000, wrap, func(c *Config) { c.Addr = "[fe80::1]:7000" })
			b := w.wrappedEndpoint("fe80::2", 7000, wrap, func(c *Config) { c.Addr = "[fe80::2]:7000" })
			for _, p := range []*proc{a, b} {
				go func() {
					for {
						c, err := p.Accept(ctxT(t, 10*time.Second))
						if err != nil {
							return
						}
						defer c.Close()
					}
				}()
			}
			c1, err := a.Dial(ctxT(t, 5*time.Second), "[fe80::2"+zone+"]:7000")
			if err != nil {
				t.Fatal(err)
			}
			defer c1.Close()
			c2, err := b.Dial(ctxT(t, 5*time.Second), "[fe80::1"+zone+"]:7000")
			if err != nil {
				t.Fatal(err)
			}
			defer c2.Close()
			if x, y := a.Stats(), b.Stats(); x.Uplinks != 1 || y.Uplinks != 1 {
				t.Errorf("uplinks: a %d, b %d; want one each (one node, one domain)", x.Uplinks, y.Uplinks)
			}
		})
	}
}

// What an endpoint remembers of addresses' domains is bounded: a server
// learns one per client process reached over an existing uplink (their
// ports come and go), and kept every one. A forgotten address is learned
// again by its next connection.
func TestAddrDomainsBounded(t *testing.T) {
	defer func(n int) { maxAddrDoms = n }(maxAddrDoms)
	maxAddrDoms = 4
	w := newWorld(t)
	a := w.endpoint("10.0.66.1", 7000)
	keep := w.endpoint("10.0.66.2", 6999) // keeps a's uplink into the node up
	kc, ks := pair(t, keep, a)
	defer kc.Close()
	defer ks.Close()
	var last *proc
	for i := range 10 {
		p := w.endpoint("10.0.66.2", 7000+i)
		c, d := pair(t, p, a)
		c.Close()
		d.Close()
		if i < 9 {
			p.Close()
		}
		last = p
	}
	a.mu.Lock()
	n, m := len(a.addrDom), len(a.addrOrder)
	a.mu.Unlock()
	if n > maxAddrDoms || m != n {
		t.Fatalf("a remembers the domain of %d addresses (%d in order), at most %d", n, m, maxAddrDoms)
	}
	if got := addrDomain(a, last); got != last.dom.ID {
		t.Fatalf("the newest address's domain was forgotten: %#x", got)
	}
	c, d := pair(t, keep, a) // the oldest, forgotten: learned again
	roundTrip(t, c, d, []byte("x"))
}
