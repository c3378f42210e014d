package xrc

import (
	"testing"
	"time"

	"github.com/goxrc/goxrc/xrc/memfabric"
)

// TestSendQueueFull: an INI's send queue holds max_send_wr sends until their
// completions are polled, and a post beyond that fails with ENOMEM. That is
// a device limit, not a failed INI: senders that meet it wait for the
// poller and post again. Eight connections share one INI whose queue holds
// one send; every message arrives once and in order, and the uplink is
// never rebuilt.
func TestSendQueueFull(t *testing.T) {
	w := newWorld(t)
	w.f.AddNode("10.0.2.1", memfabric.NodeConfig{SendQueueDepth: 1})
	a := w.endpoint("10.0.2.1", 7000)
	b := w.endpoint("10.0.2.2", 7000)
	const conns, msgs = 8, 300
	var senders, receivers [conns]*Conn
	for i := range conns {
		senders[i], receivers[i] = pair(t, a, b)
	}
	ctx := ctxT(t, 30*time.Second)
	// Whether two posts meet before the poller runs is up to the scheduler:
	// rounds until they have (one round in three misses on an idle host).
	const rounds = 50
	for r := range rounds {
		if err := streamAll(ctx, senders[:], receivers[:], r*msgs, (r+1)*msgs); err != nil {
			t.Fatalf("round %d: %v", r, err)
		}
		s := a.Stats()
		if s.Recoveries != 0 || s.Uplinks != 1 {
			t.Fatalf("round %d: a full send queue rebuilt the uplink: %+v", r, s)
		}
		if s.SendQueueFull > 0 {
			t.Logf("round %d: %d posts found the send queue full", r, s.SendQueueFull)
			return
		}
	}
	t.Fatalf("in %d rounds no post found the send queue full: nothing was tested", rounds)
}
