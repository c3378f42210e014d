package xrc

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// A one-exchange dial to us from a node our uplink to is up gets its
// reverse leg in our ACCEPT: bindReverseLocked, under the endpoint's lock,
// puts the section into the leg's cached ACCEPT (AddReverse), which took
// the acceptor's lock, held by another sender's decision across CreateTGT.
// The endpoint's lock was held until the device answered: nothing
// delivered on the connections already there, and Recv past its deadline
// (the stall f22a88e took off ReserveTag). The dial's request is decided
// first, and held after its decision (testAfterDecide) until the other
// sender's decision waits in CreateTGT.
func TestOneExchangeAcceptDuringDecisionDoesNotStallReceive(t *testing.T) {
	w := newWorld(t)
	slow := &slowTGT{armed: make(chan struct{}), entered: make(chan struct{}), release: make(chan struct{})}
	r := w.wrappedEndpoint("10.0.82.2", 7001, func(k kernel.Kernel) kernel.Kernel { slow.Kernel = k; return slow })
	s, u, third := w.endpoint("10.0.82.1", 7000), w.endpoint("10.0.82.4", 7000), w.endpoint("10.0.82.3", 7000)
	_, _ = pair(t, r, s)     // uplinks both ways: s's next dial to r asks for its reverse leg in r's ACCEPT, which r can give
	uc, urc := pair(t, u, r) // must still receive
	before := r.Stats().OneExchange
	decided := make(chan struct{})
	proceed := make(chan struct{})
	var once, relOnce sync.Once
	rel := func() { relOnce.Do(func() { close(proceed) }) }
	t.Cleanup(rel)
	hook := func(d decision) {
		if d.Accept && !d.Duplicate && !d.Moved && d.Leg != nil && d.Leg.RevTag != 0 {
			once.Do(func() {
				close(decided)
				<-proceed
			})
		}
	}
	r.testAfterDecide.Store(&hook)
	defer r.testAfterDecide.Store(nil)
	dialed := make(chan error, 1)
	go func() {
		c, err := s.Dial(ctxT(t, 10*time.Second), r.Addr().String())
		if err == nil {
			c.Close()
		}
		dialed <- err
	}()
	select {
	case <-decided:
	case <-time.After(5 * time.Second):
		t.Fatal("s's one-exchange request was never decided")
	}
	finish := holdDecision(t, slow, third, r)
	rel() // s's accepted leg gets its reverse leg (AddReverse) during the decision
	// Its ACCEPT went with the reverse leg: AddReverse, under the
	// endpoint's lock, did not wait for the decision (read without Stats,
	// which does).
	eventually(t, "r's one-exchange ACCEPT sent during the decision", func() (bool, string) {
		n := r.oneExchange.Load()
		return n == before+1, fmt.Sprintf("%d one-exchange ACCEPTs, want %d", n, before+1)
	})
	if err := uc.Send(ctxT(t, time.Second), []byte("while a decision waits")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, err := recvWithin(t, urc, 2*time.Second, buf, "a message on an established connection, while a one-exchange ACCEPT gets its reverse leg")
	if err != nil {
		t.Fatalf("a message on an established connection, while a one-exchange ACCEPT gets its reverse leg during a decision: %v", err)
	}
	if string(buf[:n]) != "while a decision waits" {
		t.Fatalf("received %q", buf[:n])
	}
	if err := finish(); err != nil {
		t.Fatalf("the dial whose TGT was held back: %v", err)
	}
	if err := <-dialed; err != nil {
		t.Fatalf("s's one-exchange dial to r: %v", err)
	}
	if got := r.Stats().OneExchange; got != before+1 {
		t.Fatalf("r's one-exchange ACCEPTs: %d, want %d (the reverse leg rode the ACCEPT)", got, before+1)
	}
}
