package xrc

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// lateDialer is a kernel whose connection requests' calls, once their
// context has ended, return only after a pause: the Dial's goroutine, woken
// by Close's cancel, is late to run (preempted, as any goroutine may be).
// Other calls (the listeners' events) are not held.
type lateDialer struct {
	wrapper
	ids *sync.Map // the ids Connect made
}

func (k lateDialer) Connect(ctx context.Context, to netip.AddrPort, ex kernel.Exchange, qpNum uint32, pd []byte) (kernel.ID, error) {
	id, err := k.Kernel.Connect(ctx, to, ex, qpNum, pd)
	if err == nil {
		k.ids.Store(id, true)
	}
	if ctx.Err() != nil {
		time.Sleep(300 * time.Millisecond)
	}
	return id, err
}

func (k lateDialer) Event(ctx context.Context, id kernel.ID) (kernel.Event, error) {
	ev, err := k.Kernel.Event(ctx, id)
	if _, mine := k.ids.Load(id); mine && err != nil && ctx.Err() != nil {
		time.Sleep(300 * time.Millisecond)
	}
	return ev, err
}

// Close releases every kernel object the endpoint holds, and a concurrent
// or later call returns once the first has released everything. A Dial whose
// link exchange was under way (its INI made, its CM id waiting for the
// peer's answer) released those itself, on its own goroutine, after Close
// had returned: Close did not wait for it, and the process still held the
// INI QP and the CM id when Close (and a second Close) returned (without
// lateDialer's pause, in 18 of 30 runs). The Dial ends with ErrClosed.
func TestCloseWaitsForDialsKernelObjects(t *testing.T) {
	w := newWorld(t)
	d := w.wrappedEndpoint("10.0.103.1", 7000, func(k kernel.Kernel) kernel.Kernel { return lateDialer{wrapper{k}, new(sync.Map)} })
	k := w.rawKernel("10.0.103.2")
	peer := netip.MustParseAddrPort("10.0.103.2:7000")
	if _, err := k.Listen(peer, kernel.ExchangeXRC); err != nil { // takes requests, answers none
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, err := d.Dial(ctxT(t, 20*time.Second), peer.String())
		errc <- err
	}()
	eventually(t, "the PHYS_REQ is out", func() (bool, string) {
		h := d.p.Handles()
		return h == 6, fmt.Sprint(h) // domain, SRQ, two listeners; the INI and its CM id
	})
	d.Close()
	if h := d.p.Handles(); h != 0 {
		t.Errorf("Close returned with %d kernel handles held (node %+v)", h, w.f.Node("10.0.103.1").Stats())
	}
	d.Close()
	if h := d.p.Handles(); h != 0 {
		t.Errorf("a second Close returned with %d kernel handles held", h)
	}
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Errorf("Dial ended by Close: %v, want ErrClosed", err)
	}
}
