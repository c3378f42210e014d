package cm

import (
	"context"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// repostHold is a fake end whose next chain of receive reposts, once
// armed, waits until released: the buffers are then neither queued nor
// posted, as they are for the moment a real post takes.
type repostHold struct {
	*fakeEnd
	armed   chan struct{} // holds one token while the next postRecvs is to wait
	reached chan struct{}
	free    chan struct{}
	fin     chan struct{} // closed when a FIN is posted
}

func (h *repostHold) postRecvs(slots []int) error {
	select {
	case <-h.armed:
		close(h.reached)
		<-h.free
	default:
	}
	return h.fakeEnd.postRecvs(slots)
}

func (h *repostHold) postSend(slot, n int, imm uint32, hasImm, signaled bool) error {
	err := h.fakeEnd.postSend(slot, n, imm, hasImm, signaled)
	if frameKind(imm>>30) == frameFin {
		close(h.fin)
	}
	return err
}

// A FIN that takes our last credit must return the buffers we consumed
// and are reposting: the peer's last credit may have gone with the frame
// whose buffer that is, and neither side could then ever send again (a
// deadlock both sides at 0 credits, each owing the other, found by a
// randomized run of both sides streaming and half-closing, depth 7/2).
// Here b's credit frame takes its last credit; a's round takes it, and
// while the round reposts its buffer a's data and FIN spend the credits,
// the FIN carrying none back.
func TestConnFinOnLastCreditCarriesReposts(t *testing.T) {
	a, b, w := fakePair(t, fakeOpts{depth: [2]int{2, 2}}) // 3 credits each, one kept back
	h := &repostHold{fakeEnd: w.ends[0], armed: make(chan struct{}, 1), reached: make(chan struct{}),
		free: make(chan struct{}), fin: make(chan struct{})}
	a.t = h
	// a's first repost (the round below, or the reaper's if it comes
	// first: the same) waits until released.
	h.armed <- struct{}{}
	ctx := ctxT(t)
	require.NoError(t, sendN(ctx, b, 2)) // b: 1 credit left, short
	require.NoError(t, sendN(ctx, a, 2)) // a: 1 left, short
	// b reads one: a is short, so the buffer goes back at once, in a
	// credit frame that takes b's last credit.
	buf := make([]byte, 256)
	_, err := b.Recv(ctx, buf)
	require.NoError(t, err)
	// a's next round takes b's frames (2 credits now) and reposts the
	// credit frame's buffer, which waits.
	got := make(chan error, 1)
	go func() {
		_, err := a.Recv(ctx, buf)
		got <- err
	}()
	<-h.reached
	require.NoError(t, a.Send(ctx, []byte("a2"))) // a: 1 credit left
	closed := make(chan error, 1)
	go func() { closed <- a.CloseWrite() }()
	// Unfixed, the FIN takes the last credit at once; fixed, it waits for
	// the repost, whenever that ends (the moment does not matter).
	select {
	case <-h.fin:
	case <-time.After(50 * time.Millisecond):
	}
	close(h.free)
	require.NoError(t, <-got)
	require.NoError(t, <-closed)
	abuf := make([]byte, 256)
	_, err = a.Recv(ctx, abuf) // b's second message
	require.NoError(t, err)
	for range 2 { // a's two other messages, then the end of a's stream
		_, err = b.Recv(ctx, buf)
		require.NoError(t, err)
	}
	_, err = b.Recv(ctx, buf)
	require.ErrorIs(t, err, io.EOF)
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second) // a hang guard, not a bound
	defer cancel()
	require.NoError(t, b.Send(sctx, []byte("b3")), "b never got a credit back: a %+v, b %+v", a.Stats(), b.Stats())
}
