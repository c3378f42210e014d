package xrc

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/verbs"
)

// removalEvents makes the RDMA CM report the device's removal on the
// endpoint's ids, as kcm's Event does for RDMA_CM_EVENT_DEVICE_REMOVAL
// (kernel.ErrDeviceRemoved): once passive is closed, on the physical links
// the endpoint accepted (the ids it called Accept on); once all is closed,
// on every id, its listeners' too. The CM sends the event to every id on
// the device, and the endpoint's goroutines read them in any order.
type removalEvents struct {
	kernel.Kernel
	mu       sync.Mutex
	accepted map[kernel.ID]bool
	passive  chan struct{}
	all      chan struct{}
}

func newRemovalEvents() *removalEvents {
	return &removalEvents{accepted: map[kernel.ID]bool{}, passive: make(chan struct{}), all: make(chan struct{})}
}

func (r *removalEvents) Accept(id kernel.ID, qpNum uint32, privateData []byte) error {
	err := r.Kernel.Accept(id, qpNum, privateData)
	if err == nil {
		r.mu.Lock()
		r.accepted[id] = true
		r.mu.Unlock()
	}
	return err
}

func (r *removalEvents) Event(ctx context.Context, id kernel.ID) (kernel.Event, error) {
	r.mu.Lock()
	removed := r.all
	if r.accepted[id] {
		removed = r.passive
	}
	r.mu.Unlock()
	return eventOrRemoval(ctx, r.Kernel, id, removed)
}

// eventOrRemoval is k's next event of id, or, once removed closes, the
// error kcm's Event returns for the CM's DEVICE_REMOVAL.
func eventOrRemoval(ctx context.Context, k kernel.Kernel, id kernel.ID, removed <-chan struct{}) (kernel.Event, error) {
	wait, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-removed:
			cancel()
		case <-wait.Done():
		}
	}()
	ev, err := k.Event(wait, id)
	select {
	case <-removed:
		if ctx.Err() == nil {
			return kernel.Event{}, &verbs.OpError{Op: "rdma_get_cm_event", Err: kernel.ErrDeviceRemoved}
		}
	default:
	}
	return ev, err
}

// A device removal reaches the endpoint as DEVICE_REMOVAL on each of its CM
// ids: its listeners' (listenLoop: the endpoint dies with ErrDeviceRemoved
// and closes itself) and its accepted physical links' (watchPassive), in
// whatever order its goroutines read them. Where a link's came first, its
// watcher took the failed Event for an RTU that never came and failed the
// link's connection with errNoRTU ("the sender never completed its physical
// link", ErrPeerGone) on a link up for long; the listeners' event a moment
// later found the connection failed already, so its application read that
// its peer was gone, not ErrDeviceRemoved (cm: Stats and errors.Is say the
// peer, not the device). With the link's event alone the endpoint went on
// working with a dead device under it.
func TestDeviceRemovalOnPassiveLinkFirst(t *testing.T) {
	w := newWorld(t)
	rm := newRemovalEvents()
	d := w.endpoint("10.0.83.1", 7000)
	s := w.wrappedEndpoint("10.0.83.2", 7000, func(k kernel.Kernel) kernel.Kernel { rm.Kernel = k; return rm })
	dc, sc := pair(t, d, s)
	roundTrip(t, dc, sc, []byte("up"))
	roundTrip(t, sc, dc, []byte("and back"))

	close(rm.passive) // the accepted link's DEVICE_REMOVAL, read first
	ctx := ctxT(t, 10*time.Second)
	if _, err := sc.Recv(ctx, make([]byte, 64)); !errors.Is(err, ErrDeviceRemoved) {
		t.Errorf("Recv on the removed device: %v, want ErrDeviceRemoved", err)
	}
	close(rm.all) // then the listeners'
	endedByRemoval(t, ctx, s, sc)
}

// endedByRemoval waits until s dies of its device's removal and closes
// itself, and checks that s and c say ErrDeviceRemoved.
func endedByRemoval(t *testing.T, ctx context.Context, s *proc, c *Conn) {
	t.Helper()
	select {
	case <-s.dead:
	case <-ctx.Done():
		t.Fatal("the endpoint on the removed device did not die")
	}
	if err := s.Err(); !errors.Is(err, ErrDeviceRemoved) {
		t.Errorf("endpoint on the removed device: Err() = %v, want ErrDeviceRemoved", err)
	}
	if err := c.Err(); !errors.Is(err, ErrDeviceRemoved) {
		t.Errorf("connection on the removed device: Err() = %v, want ErrDeviceRemoved", err)
	}
	select {
	case <-s.closeDone: // it closed itself, leaving nothing on the device
	case <-ctx.Done():
		t.Fatal("the endpoint on the removed device did not close itself")
	}
}
