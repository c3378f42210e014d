package xrc

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// A half-close's FIN queued behind a window of messages to a slow
// receiver (two SRQ receives, each poll 5 ms), while two dials to a liar on
// the receiver's node rebuild the uplink 34 times: each rebuild flushed the
// FIN (some 30 times in all), sendFrame counted every flush a try, and at
// maxTries CloseWrite failed the healthy connection with 'sends keep
// failing' and the receiver never saw its EOF (found by review, 10 runs in
// 10). As for data frames (TestLiarDialKeepsSlowStream), only a post on an
// INI that failed counts now.
func TestLiarDialKeepsQueuedFIN(t *testing.T) {
	w := newWorld(t)
	w.f.AddNode("10.0.96.2", memfabric.NodeConfig{SRQReceives: 2})
	s := w.endpoint("10.0.96.1", 7000, longTimers)
	countedTags(s.Endpoint)
	r1 := w.wrappedEndpoint("10.0.96.2", 7001, func(k kernel.Kernel) kernel.Kernel { return &slowPoll{k, 5 * time.Millisecond} }, longTimers)
	r0 := w.endpoint("10.0.96.2", 7000, longTimers)
	s1, c1 := pair(t, s, r1)
	pair(t, s, r0)
	ctx := ctxT(t, 30*time.Second)
	const n = DefaultRecvWindow
	if err := sendSeq(ctx, s1, 0, n); err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	go func() { closed <- s1.CloseWrite() }()
	time.Sleep(5 * time.Millisecond) // the FIN posted behind the window
	liar, answered := tgtGoneLiar(ctx, t, w, s, "10.0.96.2:7100", func(d uint64) uint64 { return d }, 1000)
	for range 2 {
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := s.Dial(dctx, liar.String())
		cancel()
		t.Logf("dial to the liar: %v; answered %d; s %+v", err, answered.Load(), s.Stats())
	}
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("CloseWrite: %v (s1 err %v; s %+v)", err, connErr(s1), s.Stats())
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("CloseWrite has not returned (s %+v)", s.Stats())
	}
	if err := recvSeq(ctx, c1, 0, n, nil); err != nil {
		t.Fatalf("the messages before the FIN: %v (s1 err %v; s %+v; r1 %+v)", err, connErr(s1), s.Stats(), r1.Stats())
	}
	if _, err := c1.Recv(ctx, make([]byte, 64)); err != io.EOF {
		t.Fatalf("after them: %v, want io.EOF (s1 err %v)", err, connErr(s1))
	}
}

// An internal frame whose posts keep failing still ends its connection
// after maxTries posts on failed INIs (errRetries), now that a flush counts
// no try: TestLiarDialKeepsQueuedFIN's fix must not make it retry for ever.
func TestFINFailingEveryPostEndsConn(t *testing.T) {
	w := newWorld(t)
	fs := &failingSends{}
	s := w.wrappedEndpoint("10.0.97.1", 7000, func(k kernel.Kernel) kernel.Kernel { fs.Kernel = k; return fs }, longTimers)
	r := w.endpoint("10.0.97.2", 7000, longTimers)
	sc, rc := pair(t, s, r)
	roundTrip(t, sc, rc, []byte("before"))
	fs.armed.Store(true)
	if err := sc.CloseWrite(); !errors.Is(err, errRetries) {
		t.Fatalf("CloseWrite after every post failed: %v, want errRetries (s %+v)", err, s.Stats())
	}
	if st := s.Stats(); st.Recoveries < maxTries {
		t.Fatalf("%d recoveries, want at least %d", st.Recoveries, maxTries)
	}
}
