package cm

import (
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/verbs"
)

// A CQ_ERR read after its connection gave the pair back to the device
// (qpcache.go) found no connection to mark, and the pair whose CQ takes no
// more completions stayed cached for the next connection of its sizes.
// The event now drops it.
func TestCQErrDropsCachedPair(t *testing.T) {
	cq, other := new(verbs.CQ), new(verbs.CQ) // zero: Close does nothing
	s := qpShape{4, 4, 64}
	d := &device{conns: map[*rdmaTransport]struct{}{}, qps: map[qpShape][]cachedQP{
		s: {{qp: new(verbs.QP), cq: other}, {qp: new(verbs.QP), cq: cq}},
	}, cachedQPs: 2}
	globalStats.cachedQPs.Add(2)
	t.Cleanup(func() { globalStats.cachedQPs.Add(-int64(d.cachedQPs)) })

	d.handleAsync(verbs.AsyncEvent{Type: verbs.EventCQErr, CQ: cq})
	d.mu.Lock()
	defer d.mu.Unlock()
	require.Len(t, d.qps[s], 1, "the pair whose CQ reported CQ_ERR is still cached")
	require.Same(t, other, d.qps[s][0].cq, "another pair was dropped")
	require.Equal(t, 1, d.cachedQPs)
}

// The transport a CQ_ERR is about is marked broken before the event's
// reader lets go of the device's lock: its delivery, after that, came once
// free had taken the connection off the device and looked at the mark, and
// the pair was kept. Another connection's handler holds the delivery back
// here (both on one CQ, so that one event reaches both); the order the two
// are reached in is the map's, so it is tried until the other comes first.
func TestCQErrMarksBeforeDelivery(t *testing.T) {
	cq := new(verbs.CQ)
	for range 100 {
		d := &device{conns: map[*rdmaTransport]struct{}{}, qps: map[qpShape][]cachedQP{}}
		var reachedA atomic.Bool
		a := &rdmaTransport{dev: d, cq: cq, onAsync: func(verbs.AsyncEvent) func() { reachedA.Store(true); return func() {} }}
		held, release := make(chan bool), make(chan struct{})
		b := &rdmaTransport{dev: d, cq: cq, onAsync: func(verbs.AsyncEvent) func() {
			held <- reachedA.Load()
			<-release
			return func() {}
		}}
		d.addConn(a)
		d.addConn(b)
		done := make(chan struct{})
		go func() {
			defer close(done)
			d.handleAsync(verbs.AsyncEvent{Type: verbs.EventCQErr, CQ: cq})
		}()
		aFirst := <-held
		// What free does meanwhile: off the device, then the mark.
		d.removeConn(a)
		broken := a.cqBroken.Load()
		close(release)
		<-done
		if aFirst {
			continue // a was reached first: nothing held back
		}
		require.True(t, broken, "a's CQ_ERR not marked when free looked")
		return
	}
	t.Fatal("the other connection was never reached first")
}
