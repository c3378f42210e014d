package xrc

import (
	"context"
	"errors"
	"io"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// cmTimeout answers, once armed, every CM exchange begun after with what
// the CM reports of a request nobody answered (UNREACHABLE, -ETIMEDOUT),
// and fails the next send poll once: a recovery whose MOVE the CM gives up
// on before the MOVE's own deadline.
type cmTimeout struct {
	kernel.Kernel
	armed, failPoll atomic.Bool
	mu              sync.Mutex
	ids             map[kernel.ID]bool
}

func (k *cmTimeout) PollSend(ctx context.Context, q kernel.QP, out []kernel.SendCompletion) (int, error) {
	if k.failPoll.CompareAndSwap(true, false) {
		return 0, syscall.EIO
	}
	return k.Kernel.PollSend(ctx, q, out)
}

func (k *cmTimeout) Connect(ctx context.Context, dst netip.AddrPort, ex kernel.Exchange, qpNum uint32, pd []byte) (kernel.ID, error) {
	id, err := k.Kernel.Connect(ctx, dst, ex, qpNum, pd)
	if err == nil && k.armed.Load() {
		k.mu.Lock()
		k.ids[id] = true
		k.mu.Unlock()
	}
	return id, err
}

func (k *cmTimeout) Event(ctx context.Context, id kernel.ID) (kernel.Event, error) {
	k.mu.Lock()
	timedOut := k.ids[id]
	delete(k.ids, id)
	k.mu.Unlock()
	if timedOut {
		return kernel.Event{Type: kernel.EventUnreachable, Status: -int(syscall.ETIMEDOUT)}, nil
	}
	return k.Kernel.Event(ctx, id)
}

// The peer half-closed, then a recovery's MOVE went unanswered, and the CM
// said so (-ETIMEDOUT, RejectError.Timeout) before the MOVE's deadline did:
// the peer's silence, as when the deadline finds it (errUnanswered), a
// failure even after its half FIN. It was taken for its death, which Err
// excuses after a half FIN: nil.
func TestEndpointHalfCloseThenCMTimeoutIsFailure(t *testing.T) {
	w := newWorld(t)
	r := w.endpoint("10.0.7.6", 7000, longTimers)
	k := &cmTimeout{ids: map[kernel.ID]bool{}}
	s := w.wrappedEndpoint("10.0.7.5", 7000, func(in kernel.Kernel) kernel.Kernel { k.Kernel = in; return k }, longTimers)
	cs, cr := pair(t, s, r)
	ctx := ctxT(t, 10*time.Second)
	if err := cr.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.Recv(ctx, make([]byte, 64)); !errors.Is(err, io.EOF) {
		t.Fatalf("recv: %v, want io.EOF", err)
	}
	k.armed.Store(true)
	k.failPoll.Store(true)
	var err error
	for err == nil {
		err = cs.Send(ctx, []byte("to the silent"))
	}
	if !errors.Is(err, ErrPeerGone) {
		t.Fatalf("send: %v, want ErrPeerGone", err)
	}
	if err := cs.Err(); !errors.Is(err, errUnanswered) {
		t.Fatalf("Err: %v, want the unanswered MOVE (errUnanswered); Send: %v", err, cs.Send(ctx, nil))
	}
}
