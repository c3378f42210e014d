package xrc

import (
	"fmt"
	"testing"
	"time"
)

// An inbound connection that fails after recvLegUp but before the goroutine
// that opens its reverse leg runs has finished (maybeFinishLocked unbooked
// nothing: no tag yet). That goroutine must not book a sending tag for it:
// nothing would unbook it until the endpoint closed.
func TestInboundFailBeforeReverseLegBooksNoTag(t *testing.T) {
	w := newWorld(t)
	a := w.endpoint("10.0.95.1", 7000)
	b1 := w.endpoint("10.0.95.2", 7001)
	b2 := w.endpoint("10.0.95.2", 7002)
	// a's uplink to the node: its dial to b2 is a VIRT_REQ, whose leg
	// b2's listener brings up (recvLegUp) at once. b2 has no uplink
	// back, so its reverse leg is not in the ACCEPT but spawned.
	pair(t, a, b1)

	// Hold b2's spawns: recvLegUp's goroutine waits until c has failed.
	b2.spawnMu.Lock()
	held := true
	defer func() {
		if held {
			b2.spawnMu.Unlock()
		}
	}()
	dialed := make(chan error, 1)
	go func() {
		_, err := a.Dial(ctxT(t, time.Second), b2.Addr().String())
		dialed <- err
	}()
	var c *Conn
	eventually(t, "b2's inbound leg up", func() (bool, string) {
		b2.mu.Lock()
		defer b2.mu.Unlock()
		for x := range b2.conns {
			if x.inbound && x.recvUp && !x.sendUp {
				c = x
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d conns", len(b2.conns))
	})
	c.fail(errStaleLink) // as its physical link's end would, say
	b2.spawnMu.Unlock()
	held = false

	// The dial gets no reverse leg and ends at its deadline, long after
	// the goroutine ran.
	if err := <-dialed; err == nil {
		t.Fatal("dial to b2 succeeded")
	}
	b2.mu.Lock()
	defer b2.mu.Unlock()
	if !c.finished {
		t.Fatal("c did not finish")
	}
	for tag, x := range b2.sendTags {
		if x.finished {
			t.Errorf("sendTags[%d] still books a finished connection (inbound %v, err %v)", tag, x.inbound, x.err)
		}
	}
}
