//go:build linux && cgo

package rdmacm

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/faults"
	"github.com/goxrc/goxrc/internal/fdpoll"
	"github.com/goxrc/goxrc/verbs"
	"golang.org/x/sys/unix"
)

// brokenPumpChannel runs the real pump on a pipe standing in for an event
// channel's descriptor, with n ids registered (prime, if set, sees them
// first), and returns once the pump has stopped on a failed read: the fault
// hook fails rdma_get_cm_event with EIO before any C call. The ids have no
// C id (nothing to destroy), and the channel is marked destroyed so that no
// C channel is destroyed either.
func brokenPumpChannel(t *testing.T, n int, prime func(ids []*ID)) (*EventChannel, []*ID) {
	t.Helper()
	var p [2]int
	if err := unix.Pipe(p[:]); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(p[0]); unix.Close(p[1]) })
	fd, err := fdpoll.Open(p[0], "stand-in rdma_cm event channel")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(faults.Set(func(op string) error {
		if op == "rdma_get_cm_event" {
			return syscall.EIO
		}
		return nil
	}))
	c := &EventChannel{ids: map[uintptr]*ID{}, closeDone: make(chan struct{}), destroyed: true}
	liveChannels.Created(c)
	ids := make([]*ID, n)
	c.mu.Lock()
	for i := range ids {
		ids[i] = c.registerLocked(PortSpaceTCP, verbs.QPTypeRC)
	}
	c.mu.Unlock()
	if prime != nil {
		prime(ids)
	}
	c.sys = chanSys{fd: fd, done: make(chan struct{})}
	go c.pump()
	select {
	case <-c.sys.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the pump did not stop on its failed read")
	}
	return c, ids
}

// After the application's own Close, of the id or of its channel, a wait
// says ErrClosed, as ID.Event and EventChannel.Close promise, even when the
// channel's pump broke earlier (a read of the event channel failed). The
// queue kept the first error it was closed with, the pump's, so Event after
// Close returned "rdma_get_cm_event: input/output error" instead.
func TestCloseAfterPumpBrokeSaysErrClosed(t *testing.T) {
	c, ids := brokenPumpChannel(t, 2, func(ids []*ID) {
		ids[1].q.push(Event{Type: EventEstablished}) // queued before the break
	})
	id, other := ids[0], ids[1]
	if !errors.Is(c.Err(), syscall.EIO) {
		t.Fatalf("channel Err after the failed read: %v, want EIO", c.Err())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := id.Event(ctx); !errors.Is(err, syscall.EIO) {
		t.Fatalf("Event on the broken channel: %v, want the pump's EIO", err)
	}

	// The application closes the id.
	if err := id.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := id.Event(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("Event after Close of the id: %v, want ErrClosed", err)
	}
	if _, err := id.WaitEvent(ctx, EventEstablished); !errors.Is(err, ErrClosed) {
		t.Errorf("WaitEvent after Close of the id: %v, want ErrClosed", err)
	}

	// The application closes the channel: the other id's queued event
	// still comes, then ErrClosed.
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if e, err := other.Event(ctx); err != nil || e.Type != EventEstablished {
		t.Fatalf("Event queued before the break: %v, %v", e, err)
	}
	if _, err := other.Event(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("Event after Close of the channel: %v, want ErrClosed", err)
	}
	if !errors.Is(c.Err(), syscall.EIO) {
		t.Errorf("channel Err after Close: %v, want the break's EIO still", c.Err())
	}
	if err := other.Close(); err != nil {
		t.Fatal(err)
	}
	if n := Counts(); n != (Counters{}) {
		t.Fatalf("counts after closing everything: %+v", n)
	}
}
