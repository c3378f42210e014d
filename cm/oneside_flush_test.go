package cm

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// flushHold is a fake end whose one-sided requests complete only when flushed (once, 20 ms after
// the first shutdown) or never (flush false: a device that no longer
// answers). Optional: release takes releaseDelay (the CM's time-wait);
// poll fails for good once stickyErr is set (a broken completion channel,
// rdmaTransport.wait's channelErr).
type flushHold struct {
	*fakeEnd
	posted       chan struct{}
	flush        bool
	once         *sync.Once
	releaseDelay time.Duration
	stickyErr    *atomic.Pointer[error]
	polls        *atomic.Int64
	onPost       func() // runs after the request is posted
	complete     bool   // complete at once, like fakeEnd
}

func newFlushHold(e *fakeEnd, flush bool) flushHold {
	return flushHold{fakeEnd: e, posted: make(chan struct{}, 1), flush: flush, once: new(sync.Once),
		stickyErr: new(atomic.Pointer[error]), polls: new(atomic.Int64)}
}

func (e flushHold) postRDMA(write bool, local *Region, off, n int, remote RemoteRegion, roff uint64) error {
	if e.complete {
		err := e.fakeEnd.postRDMA(write, local, off, n, remote, roff)
		if e.onPost != nil {
			e.onPost()
		}
		return err
	}
	e.w.mu.Lock()
	e.rdmaOut++
	e.w.mu.Unlock()
	select {
	case e.posted <- struct{}{}:
	default:
	}
	return nil
}

func (e flushHold) shutdown() {
	e.fakeEnd.shutdown()
	if !e.flush || e.complete {
		return
	}
	e.once.Do(func() {
		go func() {
			time.Sleep(20 * time.Millisecond)
			e.w.mu.Lock()
			e.cq = append(e.cq, completion{op: compRDMA, err: errFakeFlushed})
			e.signal()
			e.w.mu.Unlock()
		}()
	})
}

func (e flushHold) poll(ctx context.Context, cs []completion, spin time.Duration, block bool) (int, error) {
	e.polls.Add(1)
	if p := e.stickyErr.Load(); p != nil && block {
		return 0, *p
	}
	return e.fakeEnd.poll(ctx, cs, spin, block)
}

func (e flushHold) release(ctx context.Context, vanished bool) error {
	e.fakeEnd.shutdown()
	if e.releaseDelay > 0 {
		time.Sleep(e.releaseDelay)
	}
	return e.fakeEnd.release(ctx, vanished)
}

func flushHoldPair(t *testing.T, h func(*fakeEnd) flushHold) (*Conn, *Conn, *fakeWire, flushHold, *Region, RemoteRegion) {
	a, b, w := fakePair(t, fakeOpts{})
	hh := h(w.ends[0])
	a.t = hh
	exposed, err := b.RegisterMemory(64, RemoteRead|RemoteWrite)
	require.NoError(t, err)
	t.Cleanup(func() { exposed.Close() })
	local, err := a.RegisterMemory(64, 0)
	require.NoError(t, err)
	return a, b, w, hh, local, exposed.Descriptor()
}

func rdmaOutOf(w *fakeWire) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ends[0].rdmaOut
}

// Short deadline: the op waits for its flush and reports the deadline;
// later calls read ErrPeerGone, not a timeout.
func TestOneSidedShortDeadlineWaitsFlush(t *testing.T) {
	a, _, w, _, local, desc := flushHoldPair(t, func(e *fakeEnd) flushHold { return newFlushHold(e, true) })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := a.WriteRemote(ctx, local, 0, 8, desc, 0)
	t.Logf("WriteRemote after %v: %v; out %d", time.Since(start), err, rdmaOutOf(w))
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Zero(t, rdmaOutOf(w))
	err = a.Send(context.Background(), []byte("x"))
	t.Logf("Send: %v", err)
	require.ErrorIs(t, err, ErrPeerGone)
	require.False(t, errors.Is(err, context.DeadlineExceeded))
	require.NoError(t, local.Close())
}

// Close and Region.Close at once with a held op.
func TestOneSidedCloseAndRegionCloseConcurrent(t *testing.T) {
	for i := 0; i < 6; i++ {
		a, _, w, h, local, desc := flushHoldPair(t, func(e *fakeEnd) flushHold { return newFlushHold(e, i%2 == 0) })
		done := make(chan error, 1)
		go func() { done <- a.WriteRemote(context.Background(), local, 0, 8, desc, 0) }()
		<-h.posted
		var wg sync.WaitGroup
		var closeErr, rcErr error
		var outAtRC int
		var relAtRC bool
		wg.Add(2)
		go func() { defer wg.Done(); closeErr = a.Close() }()
		go func() {
			defer wg.Done()
			rcErr = local.Close()
			w.mu.Lock()
			outAtRC, relAtRC = w.ends[0].rdmaOut, w.ends[0].released
			w.mu.Unlock()
		}()
		select {
		case err := <-done:
			require.ErrorIs(t, err, ErrClosed)
		case <-time.After(5 * time.Second):
			t.Fatal("WriteRemote hung")
		}
		wg.Wait()
		require.NoError(t, closeErr)
		require.NoError(t, rcErr)
		require.True(t, outAtRC == 0 || relAtRC, "Region.Close deregistered under a posted request")
	}
}

// peerGone, then Close at once.
func TestOneSidedPeerGoneThenClose(t *testing.T) {
	a, _, w, h, local, desc := flushHoldPair(t, func(e *fakeEnd) flushHold { return newFlushHold(e, true) })
	done := make(chan error, 1)
	go func() { done <- a.WriteRemote(context.Background(), local, 0, 8, desc, 0) }()
	<-h.posted
	a.peerGone("peer disconnected")
	cerr := make(chan error, 1)
	go func() { cerr <- a.Close() }()
	select {
	case err := <-done:
		t.Logf("WriteRemote: %v, out %d", err, rdmaOutOf(w))
		// The failure that broke the connection before Close, not
		// ErrClosed.
		require.ErrorIs(t, err, ErrPeerGone)
	case <-time.After(5 * time.Second):
		t.Fatal("WriteRemote hung")
	}
	require.NoError(t, <-cerr)
	require.NoError(t, local.Close())
}

// deviceRemoved during a held op whose flush never comes.
func TestOneSidedDeviceRemovedNoFlush(t *testing.T) {
	a, _, _, h, local, desc := flushHoldPair(t, func(e *fakeEnd) flushHold { return newFlushHold(e, false) })
	done := make(chan error, 1)
	go func() { done <- a.WriteRemote(context.Background(), local, 0, 8, desc, 0) }()
	<-h.posted
	start := time.Now()
	a.deviceRemoved()
	select {
	case err := <-done:
		t.Logf("WriteRemote after %v: %v", time.Since(start), err)
		require.ErrorIs(t, err, ErrDeviceRemoved)
	case <-time.After(5 * time.Second):
		t.Fatal("WriteRemote hung")
	}
	require.NoError(t, local.Close())
}

// Close of a conn whose device never flushes a one-sided request in flight
// succeeds, and the op returns ErrClosed only once the transport is released
// (the QP gone, the device done with the region's memory), as Close's doc
// says: "at the latest once the QP is gone".
func TestOneSidedCloseNoFlushOpReturnsClosedAfterRelease(t *testing.T) {
	a, _, w, h, local, desc := flushHoldPair(t, func(e *fakeEnd) flushHold { return newFlushHold(e, false) })
	done := make(chan error, 1)
	var relAtOp atomic.Bool
	go func() {
		err := a.WriteRemote(context.Background(), local, 0, 8, desc, 0)
		w.mu.Lock()
		relAtOp.Store(w.ends[0].released)
		w.mu.Unlock()
		done <- err
	}()
	<-h.posted
	start := time.Now()
	err := a.Close()
	t.Logf("Close after %v: %v", time.Since(start), err)
	require.NoError(t, err)
	select {
	case err = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("WriteRemote hung after Close returned")
	}
	t.Logf("WriteRemote after %v: %v", time.Since(start), err)
	require.ErrorIs(t, err, ErrClosed)
	require.False(t, errors.Is(err, ErrPeerGone), "an op Close interrupted says ErrClosed: %v", err)
	require.True(t, relAtOp.Load(), "the op returned before the transport was released, with no flush of its request")
	require.NoError(t, local.Close())
}

// A one-sided op interrupted by Close returns ErrClosed at its flush (20 ms
// after the QP's move to the error state), while the release (the CM's
// time-wait, 1.5 s here) is still under way: the transport is not released
// yet when it returns, and it returns well before the configured 1.5 s. It
// guards against the op, and its region, waiting for the whole release
// (fixed in 9e8e629).
func TestOneSidedCloseOpReturnsAtFlushBeforeRelease(t *testing.T) {
	a, _, w, h, local, desc := flushHoldPair(t, func(e *fakeEnd) flushHold {
		h := newFlushHold(e, true)
		h.releaseDelay = 1500 * time.Millisecond
		return h
	})
	done := make(chan error, 1)
	go func() { done <- a.WriteRemote(context.Background(), local, 0, 8, desc, 0) }()
	<-h.posted
	start := time.Now()
	cerr := make(chan error, 1)
	go func() { cerr <- a.Close() }()
	err := <-done
	took := time.Since(start)
	w.mu.Lock()
	rel := w.ends[0].released
	w.mu.Unlock()
	t.Logf("WriteRemote after %v: %v; out %d", took, err, rdmaOutOf(w))
	require.ErrorIs(t, err, ErrClosed)
	require.False(t, errors.Is(err, ErrPeerGone), "an op Close interrupted says ErrClosed: %v", err)
	require.False(t, rel, "the op returned only after the transport's release (time-wait), not at its flush")
	// Structural: a third of the configured 1.5 s release.
	require.Less(t, took, 500*time.Millisecond, "the op waited for the whole release (time-wait), not its flush")
	require.NoError(t, local.Close())
	require.NoError(t, <-cerr)
}

// A one-sided op waiting for its flush after the peer went returns the
// connection's failure (ErrPeerGone) when the transport's poll fails for
// good (a broken completion channel: cqBroken), well within its flushing
// bound (the handshake timeout, 2 s here): it guards against the op
// spinning on a poll that fails at once until a Close (fixed in 9e8e629).
func TestOneSidedStickyPollErrorEndsFlushWait(t *testing.T) {
	a, _, _, h, local, desc := flushHoldPair(t, func(e *fakeEnd) flushHold { return newFlushHold(e, false) })
	done := make(chan error, 1)
	go func() { done <- a.WriteRemote(context.Background(), local, 0, 8, desc, 0) }()
	<-h.posted
	e := error(errors.New("ibv_get_cq_event: input/output error"))
	h.stickyErr.Store(&e)
	a.peerGone("peer disconnected") // wakes the poll; the next one fails
	select {
	case err := <-done:
		t.Logf("WriteRemote: %v after %d polls", err, h.polls.Load())
		require.ErrorIs(t, err, ErrPeerGone)
		require.False(t, errors.Is(err, ErrClosed), "no Close was called: %v", err)
	case <-time.After(4 * time.Second):
		n := h.polls.Load()
		time.Sleep(100 * time.Millisecond)
		t.Errorf("WriteRemote still blocked 4 s on (bound: 2 s); %d polls in 100 ms", h.polls.Load()-n)
		a.Close()
		<-done
	}
	require.NoError(t, local.Close())
}

// A one-sided op whose completion another caller's round handles inside
// the post (before the op looks again) succeeds and leaves rdmaOut clear
// (rdmaDone set): it guards against a stale rdmaOut, left set with no
// request out when rdmaOut was set after the post (fixed in 9e8e629).
func TestOneSidedCompletionTakenByOtherRoundClearsRdmaOut(t *testing.T) {
	var a *Conn
	a, _, _, _, local, desc := flushHoldPair(t, func(e *fakeEnd) flushHold {
		h := newFlushHold(e, true)
		h.complete = true
		h.onPost = func() {
			// A Recv leader's round, polled between the post and
			// rdmaOut = true.
			a.progress(context.Background(), a.rounds.Load())
		}
		return h
	})
	require.NoError(t, a.WriteRemote(ctxT(t), local, 0, 8, desc, 0))
	a.mu.Lock()
	out, done := a.rdmaOut, a.rdmaDone
	a.mu.Unlock()
	t.Logf("after WriteRemote: rdmaOut=%v rdmaDone=%v", out, done)
	require.False(t, out, "rdmaOut left set with no request out")
	require.True(t, done, "the completion the other round took was not recorded")
	require.NoError(t, local.Close())
}

// The peer went (the conn failed) and the device never flushes the op: a
// later Close succeeds, waiting for the op's flush no longer than flushWait
// (a structural bound, under the op's own 2 s flushing bound), and the op
// returns the failure that broke the connection (ErrPeerGone) only once the
// transport is released. It guards against Close waiting for a flushing
// round that nothing woke.
func TestOneSidedPeerGoneNoFlushThenCloseBoundedByFlushWait(t *testing.T) {
	a, _, w, h, local, desc := flushHoldPair(t, func(e *fakeEnd) flushHold { return newFlushHold(e, false) })
	done := make(chan error, 1)
	var opAt atomic.Int64
	var relAtOp atomic.Bool
	go func() {
		err := a.WriteRemote(context.Background(), local, 0, 8, desc, 0)
		opAt.Store(time.Now().UnixNano())
		w.mu.Lock()
		relAtOp.Store(w.ends[0].released)
		w.mu.Unlock()
		done <- err
	}()
	<-h.posted
	a.peerGone("peer disconnected")
	time.Sleep(50 * time.Millisecond) // the flushed receives fail the conn; the op waits for its flush
	start := time.Now()
	err := a.Close()
	took := time.Since(start)
	var opErr error
	select {
	case opErr = <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("WriteRemote hung after Close returned")
	}
	t.Logf("Close after %v: %v; WriteRemote %v after Close began: %v; transport released when the op returned: %v",
		took, err, time.Duration(opAt.Load()-start.UnixNano()), opErr, relAtOp.Load())
	require.NoError(t, err)
	require.Less(t, took, flushWait+500*time.Millisecond, "Close waited for a flushing round that nothing woke")
	require.ErrorIs(t, opErr, ErrPeerGone)
	require.True(t, relAtOp.Load(), "the op returned before the transport was released, with no flush of its request")
	require.NoError(t, local.Close())
}

// After a one-sided op completed (by another caller's round, inside the
// post), a failure, then a caller that checked its condition before it (a
// Send out of credit, sendFin, drainSends) leads a round that returns nil
// at once, no request being out, well before its 300 ms ctx: it guards
// against a stale rdmaOut making such a round sleep until its ctx (fixed in
// 9e8e629).
func TestOneSidedProgressAfterFailureReturnsAtOnce(t *testing.T) {
	var a *Conn
	a, _, w, _, local, desc := flushHoldPair(t, func(e *fakeEnd) flushHold {
		h := newFlushHold(e, true)
		h.complete = true
		h.onPost = func() { a.progress(context.Background(), a.rounds.Load()) }
		return h
	})
	require.NoError(t, a.WriteRemote(ctxT(t), local, 0, 8, desc, 0))
	seen := a.rounds.Load()
	a.fail(errors.New("some failure"))
	// The shutdown's wake-up taken by an earlier round, its flushes polled.
	w.mu.Lock()
	w.ends[0].cq = nil
	w.mu.Unlock()
	select {
	case <-w.ends[0].notify:
	default:
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := a.progress(ctx, seen)
	took := time.Since(start)
	t.Logf("progress after failure: %v after %v", err, took)
	require.NoError(t, err, "the round slept until its ctx")
	// Structural: a third of the 300 ms ctx the round would sleep until.
	require.Less(t, took, 100*time.Millisecond)
	require.NoError(t, local.Close())
}

// Short deadline while a Recv leads the polling: the op is a waiter.
func TestOneSidedShortDeadlineAsWaiter(t *testing.T) {
	for i := 0; i < 30; i++ {
		a, _, w, _, local, desc := flushHoldPair(t, func(e *fakeEnd) flushHold { return newFlushHold(e, true) })
		rerr := make(chan error, 1)
		go func() { _, err := a.Recv(context.Background(), make([]byte, 256)); rerr <- err }()
		time.Sleep(5 * time.Millisecond)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		err := a.ReadRemote(ctx, local, 0, 8, desc, 0)
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Zero(t, rdmaOutOf(w))
		re := <-rerr
		require.ErrorIs(t, re, ErrPeerGone)
		require.NoError(t, local.Close())
	}
}
