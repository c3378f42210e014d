package cm

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// longFlushWait stretches release's flushWait to 30 s for one test: a
// release that nothing woke then fails the test's 10 s bound, where with
// the real second a loaded host's delays could pass for one (a test's
// Close took 970 ms against a 500 ms bound under shuffle with another
// package's tests beside it).
func longFlushWait(t *testing.T) {
	old := flushWait
	flushWait = 30 * time.Second
	t.Cleanup(func() { flushWait = old })
}

// An operation that gave up at its flush bound (a device that never
// flushes) has returned: a later Close does not wait for it. Release waited
// on the request (still out) instead of its caller, for the whole flushWait
// with no one to wake it.
func TestReleaseAfterOpGaveUp(t *testing.T) {
	longFlushWait(t)
	a, _, _, h, local, desc := flushHoldPair(t, func(e *fakeEnd) flushHold { return newFlushHold(e, false) })
	a.timeout = 300 * time.Millisecond // the op's flush bound; Close's ctx is 3 s below
	done := make(chan error, 1)
	go func() { done <- a.WriteRemote(context.Background(), local, 0, 8, desc, 0) }()
	<-h.posted
	a.peerGone("peer disconnected")
	err := <-done // after the 300 ms bound
	t.Logf("WriteRemote: %v", err)
	require.ErrorIs(t, err, ErrPeerGone, "the failure that broke the connection")
	a.mu.Lock()
	out := a.rdmaOut
	a.mu.Unlock()
	t.Logf("rdmaOut after the op returned: %v", out)
	require.True(t, out, "precondition: the unflushed request is still out when Close begins")
	a.timeout = 3 * time.Second
	start := time.Now()
	require.NoError(t, a.Close())
	took := time.Since(start)
	t.Logf("Close took %v", took)
	// Structural: a third of the 30 s flushWait set above.
	require.Less(t, took, 10*time.Second, "Close waited in flushWait for an op that had already returned")
	require.NoError(t, local.Close())
}

// postFail: postRDMA waits until the conn has failed (release's
// fail(ErrClosed)), then fails, as a post on a QP in the error state may.
type postFail struct {
	flushHold
	c *Conn
}

func (e postFail) postRDMA(write bool, local *Region, off, n int, remote RemoteRegion, roff uint64) error {
	for {
		e.c.mu.Lock()
		failed := e.c.err != nil
		e.c.mu.Unlock()
		if failed {
			break
		}
		time.Sleep(time.Millisecond)
	}
	time.Sleep(30 * time.Millisecond) // release is in its flushWait loop now
	return errors.New("fake: post on a QP in the error state")
}

// An operation whose post fails after release began waiting for it wakes
// release as it returns (nothing woke it, and Close waited the whole
// flushWait).
func TestReleasePostFailsDuringRelease(t *testing.T) {
	longFlushWait(t)
	a, _, _, h, local, desc := flushHoldPair(t, func(e *fakeEnd) flushHold { return newFlushHold(e, true) })
	pf := postFail{flushHold: h, c: a}
	a.t = pf
	done := make(chan error, 1)
	go func() { done <- a.WriteRemote(context.Background(), local, 0, 8, desc, 0) }()
	// The op has set rdmaOut and sits in postRDMA.
	for {
		a.mu.Lock()
		out := a.rdmaOut
		a.mu.Unlock()
		if out {
			break
		}
		time.Sleep(time.Millisecond)
	}
	start := time.Now()
	require.NoError(t, a.Close())
	took := time.Since(start)
	opErr := <-done
	t.Logf("Close took %v; WriteRemote: %v", took, opErr)
	// Close had begun: ErrClosed, as for an op in flight (it was the
	// post's own error, which matched neither ErrClosed nor ErrPeerGone).
	require.ErrorIs(t, opErr, ErrClosed)
	// Structural: a third of the 30 s flushWait set above.
	require.Less(t, took, 10*time.Second, "release waited flushWait for a request that was never posted")
	require.NoError(t, local.Close())
}

// slowErr is a permanent poll error whose Is method is slow: it widens the
// window between the round's end (waiters woken) and cqBroken = true.
type slowErr struct{}

func (slowErr) Error() string { return "ibv_poll_cq: input/output error" }
func (slowErr) Is(error) bool { time.Sleep(slowIs); return false }

var slowIs = 20 * time.Millisecond

type brokenAfterRelease struct {
	flushHold
	c *Conn
}

func (e brokenAfterRelease) poll(ctx context.Context, cs []completion, spin time.Duration, block bool) (int, error) {
	e.c.mu.Lock()
	failed, waiting := e.c.err != nil, e.c.waiting.len() > 0
	e.c.mu.Unlock()
	if block && failed {
		for !waiting { // release is in its flushWait loop
			time.Sleep(time.Millisecond)
			e.c.mu.Lock()
			waiting = e.c.waiting.len() > 0
			e.c.mu.Unlock()
		}
		return 0, slowErr{}
	}
	return e.flushHold.poll(ctx, cs, spin, block)
}

// The round whose poll failed for good says so before it wakes anyone (it
// set cqBroken after waking its waiters; release, woken by one, could still
// see the CQ whole, wait again, and no round ran any more: the whole
// flushWait).
func TestReleaseCQBrokenBeforeWake(t *testing.T) {
	longFlushWait(t)
	a, _, _, h, local, desc := flushHoldPair(t, func(e *fakeEnd) flushHold { return newFlushHold(e, false) })
	a.t = brokenAfterRelease{flushHold: h, c: a}
	done := make(chan error, 1)
	go func() { done <- a.WriteRemote(context.Background(), local, 0, 8, desc, 0) }()
	<-h.posted
	start := time.Now()
	require.NoError(t, a.Close())
	took := time.Since(start)
	opErr := <-done
	t.Logf("Close took %v; WriteRemote: %v", took, opErr)
	// Close's doc: an op in flight returns ErrClosed (Close failed the
	// connection before the CQ broke).
	require.ErrorIs(t, opErr, ErrClosed)
	// Structural: a third of the 30 s flushWait set above.
	require.Less(t, took, 10*time.Second, "release missed cqBroken and waited out flushWait")
	require.NoError(t, local.Close())
}

// The same without the widened window.
func TestReleaseCQBrokenControl(t *testing.T) {
	slowIs = 0
	defer func() { slowIs = 20 * time.Millisecond }()
	TestReleaseCQBrokenBeforeWake(t)
}

// failRDMAPost refuses one-sided posts, as ibv_post_send does on a queue
// pair that broke.
type failRDMAPost struct{ *fakeEnd }

func (failRDMAPost) postRDMA(bool, *Region, int, int, RemoteRegion, uint64) error {
	return errors.New("fake: post on a broken QP")
}

// A one-sided post that fails on a connection that is up means its queue
// pair broke: ErrPeerGone, and the connection fails, as when a send's post
// fails. WriteRemote returned the post's own error, which matched neither
// ErrPeerGone nor ErrClosed, and left the connection up.
func TestOneSidedPostFailureIsPeerGone(t *testing.T) {
	a, b, w := fakePair(t, fakeOpts{})
	a.t = failRDMAPost{w.ends[0]}
	local, remote := rdmaRegions(t, a, b)
	require.ErrorIs(t, a.WriteRemote(ctxT(t), local, 0, 8, remote, 0), ErrPeerGone)
	require.ErrorIs(t, a.Send(ctxT(t), []byte("x")), ErrPeerGone, "the connection failed with the post")
}
