package xrc

import (
	"context"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// lateFINPost holds, once armed, the return of the next FIN's PostSend (the
// frame is posted) until let closes: the goroutine that posted it is late
// to wait for its completion, as a preempted one is. Its PollSend takes one
// completion at a time and reports each call, so that the test knows a
// completion was handed to its waiter (the poller polls again after).
type lateFINPost struct {
	wrapper
	armed  atomic.Bool
	posted chan struct{}
	let    chan struct{}
	finWR  atomic.Uint64
	polled atomic.Bool   // the FIN's completion was polled
	handed chan struct{} // closed at the poll after it: it was handed over
}

func (k *lateFINPost) PostSend(q kernel.QP, wrs []kernel.SendWR) error {
	// The FIN's request id is set before the post: the poller may take
	// its completion before PostSend returns, and it went unrecognised,
	// handed never closed (a hang under -race and load). The kind is read
	// before the post too: see finPosted.
	fin := wrs[0].Payload[0] == kindFIN && k.armed.CompareAndSwap(true, false)
	if fin {
		k.finWR.Store(wrs[0].WRID)
	}
	err := k.Kernel.PostSend(q, wrs)
	if fin && err != nil { // not posted: the next FIN
		k.finWR.Store(0)
		k.armed.Store(true)
	} else if fin {
		close(k.posted)
		<-k.let
	}
	return err
}

func (k *lateFINPost) PollSend(ctx context.Context, q kernel.QP, out []kernel.SendCompletion) (int, error) {
	if k.polled.CompareAndSwap(true, false) {
		close(k.handed)
	}
	n, err := k.Kernel.PollSend(ctx, q, out[:1])
	if n == 1 && k.finWR.Load() != 0 && out[0].WRID == k.finWR.Load() {
		k.polled.Store(true)
	}
	return n, err
}

// CloseWrite's FIN reached the peer and completed, yet CloseWrite failed:
// the peer read to io.EOF and closed, our answering FIN ended the
// connection, and CloseWrite, late to wait for its completion, found both
// the status and the connection's end ready, and select took the end at
// random (ErrClosed, "use of closed network connection" through cm, though
// the application closed nothing; or the context's end). Found by a
// randomized harness of cm over the fabric (half-close, then the peer's
// Close). Here the late waiter is made by holding CloseWrite's PostSend; its
// turn then keeps the answering FIN back until that FIN's timeout ends the
// connection. Several rounds: each one failed with odds of 2 in 3.
func TestCloseWriteDeliveredFINIsNoError(t *testing.T) {
	w := newWorld(t)
	const rounds = 12
	for i := range rounds {
		k := &lateFINPost{posted: make(chan struct{}), let: make(chan struct{}), handed: make(chan struct{})}
		short := func(c *Config) { c.HandshakeTimeout = 100 * time.Millisecond }
		a := w.wrappedEndpoint("10.0.120.1", 7000+i, func(kk kernel.Kernel) kernel.Kernel { k.Kernel = kk; return k }, short)
		b := w.endpoint("10.0.120.2", 7000+i)
		ca, cb := pair(t, a, b)
		roundTrip(t, ca, cb, []byte("x"))
		k.armed.Store(true)
		res := make(chan error, 1)
		go func() { res <- ca.CloseWrite() }()
		<-k.posted
		buf := make([]byte, 16)
		if _, err := cb.Recv(ctxT(t, 5*time.Second), buf); !errors.Is(err, io.EOF) {
			t.Fatalf("round %d: peer's recv after the half FIN: %v", i, err)
		}
		cb.Close()
		select {
		case <-ca.done: // the answering FIN gave up its wait for the turn
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d: connection never ended", i)
		}
		<-k.handed // the half FIN's completion waits in its channel
		close(k.let)
		if err := <-res; err != nil {
			t.Fatalf("round %d: CloseWrite whose FIN was delivered: %v", i, err)
		}
		a.Close()
		b.Close()
	}
}
