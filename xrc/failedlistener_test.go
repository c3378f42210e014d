package xrc

import (
	"context"
	"errors"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/verbs"
)

// eventsBroken is a kernel whose CM event channel breaks at brk: every
// Event wait, under way or later, on every id, fails as rdma_get_cm_event
// does once its channel's read failed (errFor["Event"]). The process and
// its device live on.
type eventsBroken struct {
	wrapper
	broken context.Context
	brk    context.CancelFunc
}

func newEventsBroken(k kernel.Kernel) *eventsBroken {
	b := &eventsBroken{wrapper: wrapper{k}}
	b.broken, b.brk = context.WithCancel(context.Background())
	return b
}

func (b *eventsBroken) Event(ctx context.Context, id kernel.ID) (kernel.Event, error) {
	return eventUnlessBroken(ctx, b.broken, b.Kernel, id)
}

// recvBroken is a kernel whose receive poll fails (EIO), under way or
// later, once brk is called, as a driver's failing poll does: the endpoint
// fails (recvLoop); its CM event channel still works.
type recvBroken struct {
	wrapper
	broken context.Context
	brk    context.CancelFunc
}

var errRecvBroken = &verbs.OpError{Op: "ibv_poll_cq", Err: syscall.EIO}

func (b *recvBroken) PollRecv(ctx context.Context, s kernel.SRQ, out []kernel.RecvCompletion) (int, error) {
	if b.broken.Err() != nil {
		return 0, errRecvBroken
	}
	ctx, cancel := context.WithCancel(ctx)
	defer context.AfterFunc(b.broken, cancel)()
	n, err := b.Kernel.PollRecv(ctx, s, out)
	if n == 0 && b.broken.Err() != nil {
		return 0, errRecvBroken
	}
	return n, err
}

// destroyCount counts each CM id's destroys.
type destroyCount struct {
	wrapper
	mu sync.Mutex
	n  map[kernel.ID]int
}

func (d *destroyCount) DestroyID(id kernel.ID) error {
	d.mu.Lock()
	d.n[id]++
	d.mu.Unlock()
	return d.Kernel.DestroyID(id)
}

// twice returns the ids destroyed more than once.
func (d *destroyCount) twice() []kernel.ID {
	d.mu.Lock()
	defer d.mu.Unlock()
	var ids []kernel.ID
	for id, n := range d.n {
		if n > 1 {
			ids = append(ids, id)
		}
	}
	return ids
}

// An endpoint that failed without a Close of the application's (Err is the
// kernel's error; the process and its device live on) kept its XRC and SIDR
// listeners in the kernel until Close. Where its CM event channel broke
// ("events"), nothing read them: a peer's REQ or SIDR REQ was queued for
// nobody and its Dial waited out its own deadline (30 s). Where its receive
// poll failed ("recv"), its listen loops went on: a peer's Dial succeeded,
// a connection on an endpoint that receives nothing and that Accept no
// longer hands out. The failure now destroys the listeners, before Err
// says it, so the peer is refused at once, as by a port nobody listens on;
// a Close after it releases the rest and destroys no id twice.
func TestFailedEndpointRefusesDials(t *testing.T) {
	for _, how := range []string{"events", "recv"} {
		for _, virt := range []bool{false, true} {
			name := how + "/physical"
			if virt {
				name = how + "/virtual"
			}
			t.Run(name, func(t *testing.T) { failedEndpointRefuses(t, how, virt) })
		}
	}
}

func failedEndpointRefuses(t *testing.T, how string, virt bool) {
	w := newWorld(t)
	var brk func()
	var dc *destroyCount
	b := w.wrappedEndpoint("10.0.68.1", 7000, func(k kernel.Kernel) kernel.Kernel {
		dc = &destroyCount{wrapper: wrapper{k}, n: map[kernel.ID]int{}}
		k = dc
		if how == "recv" {
			kb := &recvBroken{wrapper: wrapper{k}}
			kb.broken, kb.brk = context.WithCancel(context.Background())
			brk = kb.brk
			return kb
		}
		kb := newEventsBroken(k)
		brk = kb.brk
		return kb
	})
	a := w.endpoint("10.0.68.2", 7000)
	if virt {
		// A's uplink to B's node is up: the next dial is a
		// SIDR exchange (VIRT_REQ), to B's SIDR listener.
		pair(t, a, b)
	}
	brk()
	eventually(t, "B failed", func() (bool, string) {
		err := b.Err()
		return err != nil, "Err nil"
	})
	if err := b.Err(); !errors.Is(err, syscall.EIO) {
		t.Fatalf("B's Err: %v, want the injected EIO", err)
	}
	start := time.Now()
	c, err := a.Dial(ctxT(t, 30*time.Second), b.Addr().String())
	took := time.Since(start)
	if err == nil {
		c.Close()
	}
	if err == nil || took > 3*time.Second || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("Dial to the failed endpoint: %v after %v, want ECONNREFUSED at once", err, took.Round(time.Millisecond))
	}
	t.Logf("Dial: %v after %v", err, took.Round(time.Millisecond))
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if h := b.p.Handles(); h != 0 {
		t.Fatalf("B's process holds %d handles after Close", h)
	}
	if ids := dc.twice(); len(ids) > 0 {
		t.Fatalf("CM ids %v destroyed twice (the failure, then Close)", ids)
	}
}
