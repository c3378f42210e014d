package cm

import (
	"context"
	"sync"
	"testing"
	"time"
)

// A side that has only received can send its queue depth of messages while
// its peer makes no call on the connection: the credit frames it sent for
// the messages it took sit in the peer's buffers until the peer's reaper
// takes them. Without the reaper they waited for the peer's application's
// next call, and at depth 2 not one reply went (found by review).
func TestConnReplyWhilePeerMakesNoCall(t *testing.T) {
	for _, depth := range []int{2, 3, 8, 64} {
		a, b, _ := fakePair(t, fakeOpts{depth: [2]int{depth, depth}})
		ctx := ctxT(t)
		buf := make([]byte, 256)
		requestsRead(t, ctx, a, b, depth)
		// a's application is elsewhere: no call on this connection.
		sendWindow(t, ctx, b, depth)
		for range depth {
			if n, err := a.Recv(ctx, buf); err != nil || string(buf[:n]) != "reply" {
				t.Fatalf("depth %d: a's Recv: %q %v", depth, buf[:n], err)
			}
		}
	}
}

// The same after a Recv that was waiting when the reaper came and timed out
// later: the reaper, finding a caller, stopped for good (only a data post
// armed it again), and the credit frames that came after the Recv returned
// stayed untaken (found by review, 3 runs in 3).
func TestConnReaperOutlastsACaller(t *testing.T) {
	const depth = 2
	a, b, _ := fakePair(t, fakeOpts{depth: [2]int{depth, depth}})
	ctx := ctxT(t)
	buf := make([]byte, 256)
	for range depth {
		if err := a.Send(ctx, []byte("req")); err != nil {
			t.Fatal(err)
		}
	}
	rctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond) // past the reaper's first 10 ms
	_, err := a.Recv(rctx, buf)
	cancel()
	if err == nil {
		t.Fatal("a message came that nobody sent")
	}
	for range depth { // b takes the requests; a makes no call from here
		if _, err := b.Recv(ctx, buf); err != nil {
			t.Fatal(err)
		}
	}
	sendWindow(t, ctx, b, depth)
}

// requestsRead sends depth requests on a, each read by b before the next.
func requestsRead(t *testing.T, ctx context.Context, a, b *Conn, depth int) {
	t.Helper()
	buf := make([]byte, 256)
	for range depth {
		if err := a.Send(ctx, []byte("req")); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Recv(ctx, buf); err != nil {
			t.Fatal(err)
		}
	}
}

// sendWindow sends depth replies on b, each within 5 s, while b's peer
// makes no call: b has nothing of its own in flight, so its whole window
// must be free once the peer's reaper has taken b's credit frames.
func sendWindow(t *testing.T, ctx context.Context, b *Conn, depth int) {
	t.Helper()
	for sent := range depth {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := b.Send(sctx, []byte("reply"))
		cancel()
		if err != nil {
			t.Fatalf("depth %d: b's Send %d of %d, with nothing of b's in flight and its peer making no call: %v", depth, sent+1, depth, err)
		}
	}
}

// The same when the peer's reaper has already run before the replies go:
// it took b's credit frames, which gave the peer all its credits back, so
// it stopped; their buffers, reposted, are b's and go back only with a
// frame of the peer's or, once b says it is short, by the persist timer.
// b's first reply says so, but nothing took it while the peer made no
// call: at depth 3 b sent one reply of three (found by a randomized run).
func TestConnReplyAfterPeersReaperRan(t *testing.T) {
	for _, depth := range []int{2, 3, 8} {
		a, b, _ := fakePair(t, fakeOpts{depth: [2]int{depth, depth}})
		ctx := ctxT(t)
		requestsRead(t, ctx, a, b, depth)
		// a's reaper runs now, and only now.
		a.mu.Lock()
		a.reapTimer.Stop()
		a.reapArmed = false
		a.mu.Unlock()
		a.reap()
		sendWindow(t, ctx, b, depth)
	}
}

// idlePoll is a fake end that says when a blocking poll finds nothing to
// take: the caller's round is then asleep, everything before it handled.
type idlePoll struct {
	*fakeEnd
	idle chan struct{} // closed at the first such poll
	once sync.Once
}

func (p *idlePoll) poll(ctx context.Context, cs []completion, spin time.Duration, block bool) (int, error) {
	if block {
		p.w.mu.Lock()
		empty := len(p.cq) == 0
		p.w.mu.Unlock()
		if empty {
			p.once.Do(func() { close(p.idle) })
		}
	}
	return p.fakeEnd.poll(ctx, cs, spin, block)
}

// The same when the peer's reaper comes while a call of its application
// is in a round that has already taken b's credit frames, and that call
// then returns (a Recv that times out): the reaper, finding a caller and
// the peer's credits all back, stopped for good, though the peer holds
// the buffers of b's credit frames; b's first reply says it is short, and
// nothing takes it while the peer makes no call.
func TestConnReplyAfterPeersReaperMetACaller(t *testing.T) {
	const depth = 3 // deeper, b's credit frames leave a some credits out
	a, b, w := fakePair(t, fakeOpts{depth: [2]int{depth, depth}})
	p := &idlePoll{fakeEnd: w.ends[0], idle: make(chan struct{})}
	a.t = p
	ctx := ctxT(t)
	buf := make([]byte, 256)
	requestsRead(t, ctx, a, b, depth)
	a.mu.Lock()
	a.reapTimer.Stop()
	a.reapArmed = false
	a.mu.Unlock()
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := a.Recv(rctx, buf)
		done <- err
	}()
	<-p.idle // a's Recv took b's credit frames and sleeps
	a.mu.Lock()
	credits, held := a.credits, a.pending+len(a.deferred)
	a.mu.Unlock()
	if credits != a.peerSlots || held == 0 {
		t.Fatalf("a should have all its credits and hold b's buffers: %d of %d, holds %d", credits, a.peerSlots, held)
	}
	a.reap() // a's reaper comes now, and finds the caller
	cancel()
	if err := <-done; err == nil {
		t.Fatal("a message came that nobody sent")
	}
	sendWindow(t, ctx, b, depth) // a makes no call from here
}
