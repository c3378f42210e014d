package xrc

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// holdLastPoll holds, once armed, the receive loop's poll that ends with
// the endpoint's context (Close's e.cancel) until release: Close waits for
// its goroutines (e.wg) before it destroys anything, the listeners last.
type holdLastPoll struct {
	kernel.Kernel
	armed   atomic.Bool
	held    chan struct{}
	release chan struct{}
	// Once finArmed, the first PostSend of Close's FINs (closeFirst) is
	// held until finRelease.
	finArmed   atomic.Bool
	finHeld    chan struct{}
	finRelease chan struct{}
}

func (h *holdLastPoll) PostSend(q kernel.QP, wrs []kernel.SendWR) error {
	if h.finArmed.Load() {
		buf := make([]byte, 8192)
		if strings.Contains(string(buf[:runtime.Stack(buf, false)]), ").closeFirst(") && h.finArmed.CompareAndSwap(true, false) {
			close(h.finHeld)
			<-h.finRelease
		}
	}
	return h.Kernel.PostSend(q, wrs)
}

func (h *holdLastPoll) PollRecv(ctx context.Context, s kernel.SRQ, out []kernel.RecvCompletion) (int, error) {
	n, err := h.Kernel.PollRecv(ctx, s, out)
	if ctx.Err() != nil && h.armed.CompareAndSwap(true, false) {
		close(h.held)
		<-h.release
	}
	return n, err
}

// Endpoint.Err's doc (394e5ff): a Close refuses peers' dials BUSY_RETRY
// until its listeners are gone, then NO_LISTENER. The first held (a dial
// while Close posts its FINs). The second did not: Close ended the listen
// loops (e.cancel) and then waited for its goroutines (e.wg) and destroyed
// its links' CM ids and QPs before it destroyed the listeners (release's
// unlisten). Nobody read the listeners meanwhile: a dial that came then
// waited (here while the receive loop's last poll is held), and the
// listener's destruction refused it REJ CONSUMER_DEFINED with no REJECT in
// it (RejectCM), neither of the two (3 of 3 before the fix).
func TestCloseRefusesDialsBusyThenNoListener(t *testing.T) {
	w := newWorld(t)
	h := &holdLastPoll{held: make(chan struct{}), release: make(chan struct{}), finHeld: make(chan struct{}), finRelease: make(chan struct{})}
	var once1, once2 sync.Once
	finRelease := func() { once1.Do(func() { close(h.finRelease) }) }
	release := func() { once2.Do(func() { close(h.release) }) }
	r := w.wrappedEndpoint("10.0.170.1", 7000, func(k kernel.Kernel) kernel.Kernel { h.Kernel = k; return h })
	t.Cleanup(func() { finRelease(); release() }) // before r's Close in cleanup (cleanups run last first)
	a := w.endpoint("10.0.170.2", 7000)
	d := w.endpoint("10.0.170.3", 7000)
	ca, cr := pair(t, a, r)
	roundTrip(t, ca, cr, []byte("up"))
	h.finArmed.Store(true)
	h.armed.Store(true)
	closed := make(chan struct{})
	go func() { r.Close(); close(closed) }()
	select {
	case <-h.finHeld: // Close posts its FIN: the listen loops answer
	case <-time.After(5 * time.Second):
		t.Fatal("Close posted no FIN")
	}
	_, err := d.Dial(ctxT(t, 3*time.Second), r.Addr().String())
	var rj *RejectError
	if !errors.As(err, &rj) || rj.Reason != RejectBusyRetry {
		t.Errorf("a dial while Close posts its FINs: %v, want REJECT BUSY_RETRY", err)
	}
	finRelease()
	select {
	case <-h.held: // Close waits for its goroutines: the listen loops ended
		time.Sleep(50 * time.Millisecond)
	case <-time.After(5 * time.Second):
		t.Fatal("the receive loop's poll never ended with the endpoint's context")
	}
	dialed := make(chan error, 1)
	go func() {
		_, err := d.Dial(ctxT(t, 3*time.Second), r.Addr().String())
		dialed <- err
	}()
	time.Sleep(200 * time.Millisecond) // the PHYS_REQ reaches r's listener, if it is still there
	release()
	<-closed
	err = <-dialed
	if !errors.As(err, &rj) || rj.Reason != RejectBusyRetry && rj.Reason != RejectNoListener {
		t.Fatalf("a dial to an endpoint closing: %v; want REJECT BUSY_RETRY or NO_LISTENER (Endpoint.Err's doc)", err)
	}
}
