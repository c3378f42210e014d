package xrc

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// takeReverse drops the endpoint's lock before the acceptor's ReverseLeg.
// A connection that failed there gave its announced tag back at once
// (releaseRecvLocked, dropEarlyLocked: Unreserve), and ReverseLeg, which
// looks only at the registered tags, registered it anyway. Once retiredMax
// other tags have been released (Unreserve and ReserveTag take only tagMu,
// so they may run while ReverseLeg waits for the acceptor's mutex behind
// a decision's kernel calls), another dial's ReserveTag may draw the tag:
// the late ReverseLeg then registers a leg on a tag handed to that other
// dial, and erases its reservation (reserved is a set of tags, not of
// owners). The tag must stay reserved until takeReverse is done with it.
func TestReverseLegTagNotGivenBackWhileRegistering(t *testing.T) {
	w := newWorld(t)
	a := w.endpoint("10.0.67.1", 7000)
	b := w.endpoint("10.0.67.2", 7000)
	pair(t, a, b) // uplinks both ways: a's next dial asks for a reverse leg in its ACCEPT
	var (
		hooked    bool
		tag, drew uint32
	)
	hook := func(c *Conn, t0 uint32) {
		if hooked {
			return
		}
		hooked, tag = true, t0
		c.fail(errors.New("test: the connection fails before ReverseLeg"))
		acc := a.acc
		for range retiredMax { // other dials of a end meanwhile
			acc.Unreserve(acc.ReserveTag())
		}
		acc.tagMu.Lock()
		acc.tags.first = []uint32{t0}
		acc.tagMu.Unlock()
		drew = acc.ReserveTag() // another dial of a announces its tag
	}
	a.testBeforeReverseLeg.Store(&hook)
	defer a.testBeforeReverseLeg.Store(nil)
	ctx := ctxT(t, 5*time.Second)
	if c, err := a.Dial(ctx, b.Addr().String()); err == nil {
		c.Close()
		t.Fatal("the dial whose connection failed before ReverseLeg succeeded")
	}
	if !hooked {
		t.Fatal("setup: takeReverse never ran")
	}
	a.acc.tagMu.Lock()
	_, held := a.acc.reserved[drew]
	_, reg := a.acc.ours[drew]
	a.acc.tagMu.Unlock()
	if drew == tag {
		t.Errorf("tag %#x, announced by the failing dial and about to be registered by its ReverseLeg, was handed to another dial", tag)
	}
	if !held || reg {
		t.Errorf("the other dial's tag %#x: reserved %v, registered %v; want reserved, not registered", drew, held, reg)
	}
	a.acc.Unreserve(drew)
	eventually(t, "the failed dial's tag given back", func() (bool, string) {
		a.acc.tagMu.Lock()
		defer a.acc.tagMu.Unlock()
		_, held := a.acc.reserved[tag]
		_, reg := a.acc.ours[tag]
		return !held && !reg && len(a.acc.reserved) == 0, fmt.Sprintf("reserved %v, registered %v, %d reserved in all", held, reg, len(a.acc.reserved))
	})
}
