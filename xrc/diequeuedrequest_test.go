package xrc

import (
	"context"
	"testing"

	"github.com/goxrc/goxrc/internal/kernel"
)

// Endpoint.Err's doc: once it failed, "peers' dials to its address are
// refused at once (ECONNREFUSED, RejectNoListener)". die destroys the
// listeners (unlisten), but a listen loop answers one request at a time:
// the requests queued behind a decision are destroyed with the listener,
// and the CM refuses them with its own REJ, CONSUMER_DEFINED (CM status
// 28), neither BUSY_RETRY nor NO_LISTENER. Here the decision is held
// (testAfterDecide) while a second node's PHYS_REQ queues and the endpoint
// fails by its receive poll (its CM event channel still works). Virtual:
// both dialers have an uplink to r's node already, and their requests are
// VIRT_REQs at r's SIDR listener.
func TestDieAnswersRequestsQueuedBehindADecision(t *testing.T) {
	for _, virt := range []bool{false, true} {
		name := "physical"
		if virt {
			name = "virtual"
		}
		t.Run(name, func(t *testing.T) { dieAnswersQueued(t, virt) })
	}
}

func dieAnswersQueued(t *testing.T, virt bool) {
	w := newWorld(t)
	var rb *recvBroken
	r := w.wrappedEndpoint("10.0.172.1", 7000, func(k kernel.Kernel) kernel.Kernel {
		rb = &recvBroken{wrapper: wrapper{k}}
		rb.broken, rb.brk = context.WithCancel(context.Background())
		return rb
	})
	d1 := w.endpoint("10.0.172.2", 7000)
	d2 := w.endpoint("10.0.172.3", 7000)
	if virt {
		pair(t, d1, r)
		pair(t, d2, r)
	}
	dialed, rel := queueBehindDecision(t, r, d1, d2)
	rb.brk()
	err := queuedAnswer(t, dialed, rel)
	// The drain answers before die has set Err.
	eventually(t, "r failed", func() (bool, string) { return r.Err() != nil, "Err nil" })
	t.Logf("the queued dial: %v", err)
	requireBusyOrNoListener(t, err, "a dial queued behind a decision when the endpoint failed")
}
