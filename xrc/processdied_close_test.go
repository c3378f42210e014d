package xrc

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// postHold holds the first PostSend after arm until release is closed.
type postHold struct {
	wrapper
	armed   atomic.Bool
	at      chan struct{}
	release chan struct{}
}

func (k *postHold) PostSend(q kernel.QP, wrs []kernel.SendWR) error {
	if k.armed.CompareAndSwap(true, false) {
		close(k.at)
		<-k.release
	}
	return k.Kernel.PostSend(q, wrs)
}

// The application's Close came first: a kill of the endpoint's process
// while that Close still waits for its connections' FINs is no death of an
// endpoint that was working. Err, and the errors of the connections the
// Close ended, say ErrClosed, as failLocked and closedErr do once Close has
// begun; die said ErrProcessDied.
func TestEndpointKilledDuringCloseIsClosed(t *testing.T) {
	w := newWorld(t)
	k := &postHold{at: make(chan struct{}), release: make(chan struct{})}
	a := w.wrappedEndpoint("10.0.199.1", 7000, func(in kernel.Kernel) kernel.Kernel { k.Kernel = in; return k })
	b := w.endpoint("10.0.199.2", 7000)
	ca, _ := pair(t, a, b)
	k.armed.Store(true) // the FIN of a's Close
	done := make(chan struct{})
	go func() {
		a.Close()
		close(done)
	}()
	<-k.at // Close has begun: its FIN is being posted
	a.p.Kill()
	eventually(t, "the kill seen", func() (bool, string) {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.fatal != nil || closed(a.ctx.Done()), "not yet"
	})
	close(k.release)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not return")
	}
	for what, err := range map[string]error{"Endpoint.Err": a.Err(), "Conn.Err": ca.Err()} {
		if err != nil && (errors.Is(err, ErrProcessDied) || !errors.Is(err, ErrClosed)) {
			t.Errorf("%s after Close, then the process's kill during it: %v; want ErrClosed (the application closed it first)", what, err)
		}
	}
}

// errHold returns the errors of Event and PollRecv only once their context
// has ended: nothing of the engine hears of the process's death by itself.
type errHold struct{ wrapper }

func (k *errHold) Event(ctx context.Context, id kernel.ID) (kernel.Event, error) {
	ev, err := k.Kernel.Event(ctx, id)
	if err != nil {
		<-ctx.Done()
	}
	return ev, err
}

func (k *errHold) PollRecv(ctx context.Context, s kernel.SRQ, out []kernel.RecvCompletion) (int, error) {
	n, err := k.Kernel.PollRecv(ctx, s, out)
	if err != nil {
		<-ctx.Done()
	}
	return n, err
}

// The reverse: the process died first, and the application's Close came
// before the engine had noticed (die). Err and the connections' errors say
// ErrProcessDied, as closedErr says for the same order ("before die says
// it"); they said ErrClosed, as if the application had closed a working
// endpoint.
func TestEndpointKilledBeforeCloseIsProcessDeath(t *testing.T) {
	w := newWorld(t)
	a := w.wrappedEndpoint("10.0.200.1", 7000, func(in kernel.Kernel) kernel.Kernel { return &errHold{wrapper{in}} })
	b := w.endpoint("10.0.200.2", 7000)
	ca, _ := pair(t, a, b)
	a.p.Kill()
	if err := a.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	for what, err := range map[string]error{"Endpoint.Err": a.Err(), "Conn.Err": ca.Err()} {
		if errors.Is(err, ErrClosed) || !errors.Is(err, ErrProcessDied) {
			t.Errorf("%s after the process's kill, then Close: %v; want ErrProcessDied (the process died first)", what, err)
		}
	}
}
