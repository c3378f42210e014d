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
	dialed, rel := queueBehindDecision(t, r, d1, d2)
	closed := make(chan struct{})
	go func() { r.Close(); close(closed) }()
	err := queuedAnswer(t, dialed, rel)
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return")
	}
	requireBusyOrNoListener(t, err, "a dial queued behind a decision when Close came")
}

// queueBehindDecision holds r's decision of d1's request (testAfterDecide)
// and has d2 dial r, its request queued at r's listener behind d1's. rel
// lets the decision go; the test's end does too, before r's Close.
func queueBehindDecision(t *testing.T, r, d1, d2 *proc) (dialed <-chan error, rel func()) {
	t.Helper()
	inDecide := make(chan struct{})
	release := make(chan struct{})
	var first atomic.Bool
	var relOnce sync.Once
	rel = func() { relOnce.Do(func() { close(release) }) }
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
	ch := make(chan error, 1)
	go func() {
		_, err := d2.Dial(ctxT(t, 4*time.Second), r.Addr().String())
		ch <- err
	}()
	time.Sleep(200 * time.Millisecond) // d2's request queued at r's listener, behind d1's
	return ch, rel
}

// queuedAnswer is the queued dial's error, which must come while the
// decision is still held; then it lets the decision go.
func queuedAnswer(t *testing.T, dialed <-chan error, rel func()) error {
	t.Helper()
	var err error
	select {
	case err = <-dialed:
	case <-time.After(3 * time.Second):
		t.Error("the queued dial was not answered while the loop decided another")
		rel()
		err = <-dialed
	}
	rel()
	return err
}

// requireBusyOrNoListener: Endpoint.Err's doc promises a refused dial one
// of the two.
func requireBusyOrNoListener(t *testing.T, err error, what string) {
	t.Helper()
	var rj *RejectError
	if !errors.As(err, &rj) || rj.Reason != RejectBusyRetry && rj.Reason != RejectNoListener {
		t.Fatalf("%s: %v; want REJECT BUSY_RETRY or NO_LISTENER (Endpoint.Err's doc)", what, err)
	}
}
