package xrc

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Endpoint.Err's doc: "A Close refuses them too, BUSY_RETRY until its
// listeners are gone", then NO_LISTENER. e161596 answered a request that
// came while no loop read the listeners, but a listen loop answers one
// request at a time: while it decides one (the acceptor's kernel calls, a
// TGT to create), the next requests queue at the listener. Close destroyed
// the listener with them queued, and the CM refused them with its own REJ,
// CONSUMER_DEFINED (RejectCM, CM status 28), neither of the two. Here the
// decision is held (testAfterDecide) while a second node's PHYS_REQ queues
// and Close runs.
func TestCloseAnswersRequestsQueuedBehindADecision(t *testing.T) {
	w := newWorld(t)
	r := w.endpoint("10.0.171.1", 7000)
	d1 := w.endpoint("10.0.171.2", 7000)
	d2 := w.endpoint("10.0.171.3", 7000)
	inDecide := make(chan struct{})
	release := make(chan struct{})
	var first atomic.Bool
	var relOnce sync.Once
	rel := func() { relOnce.Do(func() { close(release) }) }
	t.Cleanup(rel) // before r's Close in cleanup (cleanups run last first)
	hook := func(decision) {
		if first.CompareAndSwap(false, true) { // d1's only
			close(inDecide)
			<-release
		}
	}
	r.testAfterDecide.Store(&hook)
	go d1.Dial(ctxT(t, 5*time.Second), r.Addr().String())
	select {
	case <-inDecide:
	case <-time.After(5 * time.Second):
		t.Fatal("the first dial's request was never decided")
	}
	dialed := make(chan error, 1)
	go func() {
		_, err := d2.Dial(ctxT(t, 4*time.Second), r.Addr().String())
		dialed <- err
	}()
	time.Sleep(200 * time.Millisecond) // d2's PHYS_REQ queued at r's listener, behind d1's
	closed := make(chan struct{})
	go func() { r.Close(); close(closed) }()
	var err error
	select {
	case err = <-dialed: // answered while the loop's decision is still held
	case <-time.After(3 * time.Second):
		t.Error("the queued dial was not answered while the loop decided another")
		rel()
		err = <-dialed
	}
	rel()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return")
	}
	var rj *RejectError
	if !errors.As(err, &rj) || rj.Reason != RejectBusyRetry && rj.Reason != RejectNoListener {
		t.Fatalf("a dial queued behind a decision when Close came: %v; want REJECT BUSY_RETRY or NO_LISTENER (Endpoint.Err's doc)", err)
	}
}
