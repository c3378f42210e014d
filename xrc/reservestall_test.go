package xrc

import (
	"fmt"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// A dial of ours whose forward leg announces its reverse leg's tag reserves
// that tag (ReserveTag) under the endpoint's lock, in openLeg; the
// reservation took the acceptor's lock, which another sender's decision
// holds across CreateTGT. The endpoint's lock was held until the device
// answered: nothing delivered on the connections already there, and Recv
// past its deadline (the stall e5466e0 took off Release, Unreserve and
// Reap).
func TestDialDuringDecisionDoesNotStallReceive(t *testing.T) {
	w := newWorld(t)
	slow := &slowTGT{armed: make(chan struct{}), entered: make(chan struct{}), release: make(chan struct{})}
	r := w.wrappedEndpoint("10.0.81.2", 7001, func(k kernel.Kernel) kernel.Kernel { slow.Kernel = k; return slow })
	s, u, third := w.endpoint("10.0.81.1", 7000), w.endpoint("10.0.81.4", 7000), w.endpoint("10.0.81.3", 7000)
	_, _ = pair(t, r, s)     // r's uplink to s is up: r's next dial to s goes at once
	uc, urc := pair(t, u, r) // must still receive
	before := r.Stats().VirtReqs
	finish := holdDecision(t, slow, third, r)
	// r dials s during the decision: the forward leg reserves its reverse
	// leg's tag.
	redial := make(chan error, 1)
	go func() {
		c, err := r.Dial(ctxT(t, 10*time.Second), s.Addr().String())
		if err == nil {
			c.Close()
		}
		redial <- err
	}()
	// Its VIRT_REQ went: the reservation, under the endpoint's lock, did
	// not wait for the decision (read without Stats, which does).
	eventually(t, "r's dial sends its VIRT_REQ during the decision", func() (bool, string) {
		n := r.virtReqs.Load()
		return n > before, fmt.Sprintf("%d VIRT_REQs, want more than %d", n, before)
	})
	if err := uc.Send(ctxT(t, time.Second), []byte("while a decision waits")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, err := recvWithin(t, urc, 2*time.Second, buf, "a message on an established connection, while a dial of ours reserves a tag")
	if err != nil {
		t.Fatalf("a message on an established connection, while a dial of ours goes during a decision: %v", err)
	}
	if string(buf[:n]) != "while a decision waits" {
		t.Fatalf("received %q", buf[:n])
	}
	if err := finish(); err != nil {
		t.Fatalf("the dial whose TGT was held back: %v", err)
	}
	if err := <-redial; err != nil {
		t.Fatalf("r's dial to s: %v", err)
	}
}
