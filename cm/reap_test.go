package cm

import (
	"context"
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
		for range depth { // a sends its window, b reads it
			if err := a.Send(ctx, []byte("req")); err != nil {
				t.Fatal(err)
			}
			if _, err := b.Recv(ctx, buf); err != nil {
				t.Fatal(err)
			}
		}
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
		buf := make([]byte, 256)
		for range depth {
			if err := a.Send(ctx, []byte("req")); err != nil {
				t.Fatal(err)
			}
			if _, err := b.Recv(ctx, buf); err != nil {
				t.Fatal(err)
			}
		}
		// a's reaper runs now, and only now.
		a.mu.Lock()
		a.reapTimer.Stop()
		a.reapArmed = false
		a.mu.Unlock()
		a.reap()
		sendWindow(t, ctx, b, depth)
	}
}
