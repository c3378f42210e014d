package xrc

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// heldDestroy holds the first CM id destroy after arm until open closes.
type heldDestroy struct {
	wrapper
	armed   atomic.Bool
	once    sync.Once
	holding chan struct{} // closed once that destroy waits
	open    chan struct{}
}

func (h *heldDestroy) DestroyID(id kernel.ID) error {
	if h.armed.Load() {
		first := false
		h.once.Do(func() { first = true })
		if first {
			close(h.holding)
			<-h.open
		}
	}
	return h.Kernel.DestroyID(id)
}

// The device's removal reaches the listeners (DEVICE_REMOVAL) as the
// endpoint fails of another error its device's loss caused (the receive
// poll's EIO): that die took the listeners off the endpoint, so the listen
// loops, reading the removal on ids no longer the endpoint's, returned
// quietly, and the endpoint, which learns of a removal from its ids alone,
// never closed itself (the package doc: it closes itself, leaving nothing
// on the device). Before unlisten a listen loop always died of it.
func TestRemovalAsFailedEndpointUnlistens(t *testing.T) {
	w := newWorld(t)
	rm := newRemovalEvents()
	var su *heldDestroy
	var rb *recvBroken
	b := w.wrappedEndpoint("10.0.72.1", 7000, func(k kernel.Kernel) kernel.Kernel {
		su = &heldDestroy{wrapper: wrapper{k}, holding: make(chan struct{}), open: make(chan struct{})}
		rb = &recvBroken{wrapper: wrapper{su}}
		rb.broken, rb.brk = context.WithCancel(context.Background())
		rm.Kernel = rb
		return rm
	})
	var once sync.Once
	openGate := func() { once.Do(func() { close(su.open) }) }
	defer openGate()
	su.armed.Store(true)
	rb.brk() // the receive poll fails: die, unlisten, its first destroy held
	select {
	case <-su.holding:
	case <-time.After(5 * time.Second):
		t.Fatal("no listener destroyed after the receive poll failed")
	}
	close(rm.all) // DEVICE_REMOVAL on the listeners, meanwhile
	time.Sleep(100 * time.Millisecond)
	openGate()
	select {
	case <-b.closeDone:
	case <-time.After(5 * time.Second):
		t.Fatalf("the endpoint did not close itself after its device's removal (Err %v)", b.Err())
	}
	if err := b.Err(); err == nil || errors.Is(err, ErrClosed) {
		t.Fatalf("Err() = %v, want the failure", err)
	}
}
