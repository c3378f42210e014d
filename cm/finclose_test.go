package cm

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// starveFin leaves a with no credit at all: its data took all but one, and a
// credit return (for b's messages, which a read) took the last. a's FIN must
// then wait for b to read and return credits. With thaw, b is frozen (see
// frozenEnd) until thaw is closed, and the handshake timeout is short.
func starveFin(t *testing.T, thaw chan struct{}) (*Conn, *Conn) {
	o := fakeOpts{depth: [2]int{4, 4}}
	if thaw != nil {
		o.timeout = 100 * time.Millisecond
	}
	a, b, _ := starveFinWith(t, o, thaw)
	return a, b
}

// starveFinWith is starveFin on a pair made with o, and returns the wire too.
func starveFinWith(t *testing.T, o fakeOpts, thaw chan struct{}) (*Conn, *Conn, *fakeWire) {
	t.Helper()
	a, b, w := fakePair(t, o)
	if thaw != nil {
		b.t = frozenEnd{w.ends[1], thaw}
	}
	ctx := ctxT(t)
	for range o.depth[0] {
		require.NoError(t, a.Send(ctx, []byte("unread")))
	}
	buf := make([]byte, 256)
	for range 3 {
		require.NoError(t, b.Send(ctx, []byte("to a")))
		_, err := a.Recv(ctx, buf)
		require.NoError(t, err)
	}
	a.mu.Lock()
	credits := a.credits
	a.mu.Unlock()
	require.Zero(t, credits, "setup: a should have no credit left")
	return a, b, w
}

// Close alone waits (bounded) for a credit to send its FIN: b, reading
// late, gets its 4 messages and then io.EOF.
func TestCloseAloneDeliversFinWhenCreditComesLate(t *testing.T) {
	a, b := starveFin(t, nil)
	readDone := make(chan error, 1)
	go func() { time.Sleep(50 * time.Millisecond); readDone <- readAll(t, b) }()
	require.NoError(t, a.Close())
	require.ErrorIs(t, <-readDone, io.EOF)
	require.Equal(t, uint64(0), b.Stats().Errors)
}

// The same with a CloseWrite blocked on that credit when Close comes: Close
// waits for CloseWrite's FIN. It did not send the FIN (CloseWrite claimed
// it), its drain found no send outstanding and it released at once; the FIN
// never went out, and b saw a disconnect without one: ErrPeerGone, counted
// as a failure.
func TestCloseDuringBlockedCloseWriteSendsFin(t *testing.T) {
	a, b := starveFin(t, nil)
	cw := make(chan error, 1)
	go func() { cw <- a.CloseWrite() }()
	time.Sleep(20 * time.Millisecond) // CloseWrite is waiting for a credit
	readDone := make(chan error, 1)
	go func() { time.Sleep(50 * time.Millisecond); readDone <- readAll(t, b) }()
	start := time.Now()
	require.NoError(t, a.Close())
	cwErr := <-cw
	t.Logf("Close returned after %v; CloseWrite: %v", time.Since(start), cwErr)
	require.NoError(t, cwErr, "CloseWrite's FIN went out (Close waited for it)")
	require.ErrorIs(t, <-readDone, io.EOF, "b should read a's 4 messages and then the end of stream")
	require.Equal(t, uint64(0), b.Stats().Errors, "a graceful close counted as a failure at the peer")
}

func readAll(t *testing.T, c *Conn) error {
	buf := make([]byte, 256)
	for i := 0; ; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := c.Recv(ctx, buf)
		cancel()
		if err != nil {
			t.Logf("read %d messages, then %v", i, err)
			return err
		}
	}
}

// A one-sided operation in flight when the connection fails (here by Close)
// waits for its own flushed completion, or for release to take the QP
// (destroyed or reset, the device is done with the request), before it
// returns: its read lock on the local region goes with it, and Region.Close
// may deregister the memory, and the application reuse it. It returned as
// soon as it saw the failure, with the request still posted.
func TestOneSidedWaitsForItsCompletion(t *testing.T) {
	a, _, w, h, local, desc := flushHoldPair(t, func(e *fakeEnd) flushHold { return newFlushHold(e, true) })
	type result struct {
		err           error
		out           int
		transportGone bool
	}
	done := make(chan result, 1)
	go func() {
		err := a.WriteRemote(context.Background(), local, 0, 8, desc, 0)
		w.mu.Lock()
		defer w.mu.Unlock()
		done <- result{err, w.ends[0].rdmaOut, w.ends[0].released}
	}()
	<-h.posted
	go a.Close()
	r := <-done
	t.Logf("WriteRemote: %v; requests not completed: %d; transport released: %v", r.err, r.out, r.transportGone)
	require.ErrorIs(t, r.err, ErrClosed)
	require.True(t, r.out == 0 || r.transportGone, "WriteRemote returned while its request was posted on a live QP")
	require.NoError(t, local.Close())
}

// The same when the connection fails under the request (the peer is gone)
// and no Close follows: the flushed completion ends the wait.
func TestOneSidedWaitsForItsFlush(t *testing.T) {
	a, _, w, h, local, desc := flushHoldPair(t, func(e *fakeEnd) flushHold { return newFlushHold(e, true) })
	defer local.Close()
	done := make(chan error, 1)
	go func() { done <- a.WriteRemote(context.Background(), local, 0, 8, desc, 0) }()
	<-h.posted
	a.peerGone("peer disconnected")
	err := <-done
	require.ErrorIs(t, err, ErrPeerGone)
	require.Zero(t, rdmaOutOf(w), "WriteRemote returned before its flushed completion")
}

// The interleaving behind a rare failure of the test above under load: a's
// release shuts its QP (fail) a moment before its transport's release tells
// b's CM (peerGone); b, reading a's last messages, posts a credit return in
// that gap, and its next round takes a's FIN and that request's completion
// together. On a device the request is retried (a's QP drops the packets)
// until the disconnect reaches b and flushes it, so b takes the flush for
// the end after a's FIN. The fake failed it at once, and b counted a
// graceful close as a failure.
func TestCreditReturnBeforePeersDisconnectNotCounted(t *testing.T) {
	a, b, w := fakePair(t, fakeOpts{depth: [2]int{4, 4}})
	ctx := ctxT(t)
	for range 2 {
		require.NoError(t, a.Send(ctx, []byte("last words")))
	}
	buf := make([]byte, 256)
	_, err := b.Recv(ctx, buf) // b's round takes both messages
	require.NoError(t, err)
	require.NoError(t, a.CloseWrite()) // b has not polled the FIN yet
	w.ends[0].shutdown()               // a's release has shut its QP; its disconnect is on the way
	_, err = b.Recv(ctx, buf)          // the second read makes a credit return due: posted into the gap
	require.NoError(t, err)
	w.mu.Lock()
	require.Equal(t, 1, w.ends[1].sends, "setup: b's credit return should be posted in the gap")
	w.mu.Unlock()
	_, err = b.Recv(ctx, buf) // takes the FIN, and the credit return's completion if there is one
	require.ErrorIs(t, err, io.EOF)
	require.Equal(t, uint64(0), b.Stats().Errors, "a graceful close counted as a failure at the peer")
	b.peerGone("peer disconnected") // a's transport release tells b
	require.NoError(t, b.Close())
	require.Equal(t, uint64(0), b.Stats().Errors, "a graceful close counted as a failure at the peer")
}

// frozenEnd is a fake end whose process is stopped (SIGSTOP, a long pause)
// until thaw is closed: its polls find nothing, so it returns no credits.
type frozenEnd struct {
	*fakeEnd
	thaw chan struct{}
}

func (e frozenEnd) poll(ctx context.Context, cs []completion, spin time.Duration, block bool) (int, error) {
	select {
	case <-e.thaw:
		return e.fakeEnd.poll(ctx, cs, spin, block)
	default:
	}
	if !block {
		return 0, nil
	}
	select {
	case <-e.thaw:
		return e.fakeEnd.poll(ctx, cs, spin, block)
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// A CloseWrite that gave up waiting for a credit for its FIN (the peer was
// frozen past the handshake timeout) posted no FIN: a later Close, or
// CloseWrite again, must send it once there is room. Close sent none
// (CloseWrite had claimed it), and CloseWrite again returned nil having
// sent nothing: b, reading once thawed, saw a disconnect without a FIN (a
// failure, not io.EOF), or, after the second CloseWrite, no end at all.
func TestFinAfterCloseWriteGaveUp(t *testing.T) {
	for _, then := range []string{"Close", "CloseWrite"} {
		t.Run(then, func(t *testing.T) {
			thaw := make(chan struct{})
			a, b := starveFin(t, thaw)
			require.ErrorIs(t, a.CloseWrite(), context.DeadlineExceeded, "no credit came for the FIN")

			close(thaw)
			readDone := make(chan error, 1)
			go func() { readDone <- readAll(t, b) }()
			if then == "Close" {
				require.NoError(t, a.Close())
			} else {
				require.NoError(t, a.CloseWrite())
			}
			select {
			case err := <-readDone:
				require.ErrorIs(t, err, io.EOF, "b reads a's messages and then the end of stream")
			case <-time.After(10 * time.Second):
				t.Fatal("b read no end of stream")
			}
			require.Equal(t, uint64(0), b.Stats().Errors, "a graceful close counted as a failure at the peer")
		})
	}
}

// A Send blocked on credits when CloseWrite comes fails with ErrClosed, as
// Sends after it do. With no credit left for the FIN either (the frozen
// peer returns none), nothing completed to wake it, and it waited on until
// its own context ended (found by review; XRC's CloseWrite woke it).
func TestCloseWriteWakesBlockedSend(t *testing.T) {
	a, _ := starveFin(t, make(chan struct{}))
	ctx := ctxT(t)
	sent := make(chan error, 1)
	go func() { sent <- a.Send(ctx, []byte("blocked")) }()
	require.Eventually(t, func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.polling
	}, 5*time.Second, time.Millisecond, "setup: the Send never waited")
	require.ErrorIs(t, a.CloseWrite(), context.DeadlineExceeded, "setup: a credit came for the FIN")
	select {
	case err := <-sent:
		require.ErrorIs(t, err, ErrClosed, "the Send blocked when CloseWrite came")
	case <-time.After(5 * time.Second):
		t.Fatal("a Send blocked on credits still waits 5 s after CloseWrite")
	}
}
