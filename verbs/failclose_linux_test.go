//go:build linux && cgo

package verbs

import (
	"context"
	"errors"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/faults"
)

// openRXE opens $RXE_DEV (the VM harness's soft-RoCE device); it skips
// without one and fails if it cannot open.
func openRXE(t *testing.T) *Context {
	t.Helper()
	dev := os.Getenv("RXE_DEV")
	if dev == "" {
		t.Skip("no soft-RoCE device (RXE_DEV unset): run through the VM harness")
	}
	if !Counts().IsZero() {
		t.Fatalf("objects left over from an earlier test: %+v", Counts())
	}
	c, err := OpenDevice(dev)
	if err != nil {
		t.Fatalf("RXE_DEV=%s is set but the device does not open: %v", dev, err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
		if !Counts().IsZero() {
			t.Errorf("leaked verbs objects: %+v", Counts())
		}
	})
	return c
}

// failNext makes the next C destroy named op fail with EIO, once.
func failNext(t *testing.T, op string) {
	t.Cleanup(faults.Set(faults.FailOnce(op, syscall.EIO)))
}

// stillWaiting fails the test if the wait in done has ended.
func stillWaiting(t *testing.T, done <-chan error, what string) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("%s ended at a Close that failed: %v", what, err)
	case <-time.After(200 * time.Millisecond):
	}
}

func closedNow(t *testing.T, done <-chan error, what string) {
	t.Helper()
	select {
	case err := <-done:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("%s after Close: %v, want ErrClosed", what, err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("%s not woken by Close", what)
	}
}

// A Close whose C destroy fails leaves the object open and usable: its
// waiters, woken to let the destroy run, wait on, and a later Close works.
func TestFailedDestroyLeavesObjectUsable(t *testing.T) {
	c := openRXE(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	t.Run("CQ", func(t *testing.T) {
		ch, err := c.NewCompChannel()
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		cq, err := c.CreateCQ(4, ch, 0)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := cq.Wait(ctx, make([]WorkCompletion, 4))
			done <- err
		}()
		time.Sleep(50 * time.Millisecond) // the Wait sleeps in the netpoller
		failNext(t, "ibv_destroy_cq")
		if err := cq.Close(); !errors.Is(err, syscall.EIO) {
			t.Fatalf("Close with a failing destroy: %v, want EIO", err)
		}
		if Counts().CQs != 1 {
			t.Fatalf("after the failed Close: %+v, want the CQ counted", Counts())
		}
		stillWaiting(t, done, "CQ.Wait")
		if err := cq.Close(); err != nil {
			t.Fatal(err)
		}
		closedNow(t, done, "CQ.Wait")
	})

	t.Run("shared-channel", func(t *testing.T) {
		ch, err := c.NewSharedCompChannel()
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() {
			_, err := ch.GetEvents(ctx, make([]*CQ, 4))
			done <- err
		}()
		time.Sleep(50 * time.Millisecond)
		failNext(t, "ibv_destroy_comp_channel")
		if err := ch.Close(); !errors.Is(err, syscall.EIO) {
			t.Fatalf("Close with a failing destroy: %v, want EIO", err)
		}
		stillWaiting(t, done, "GetEvents")
		// Still a working channel: a CQ binds to it.
		cq, err := c.CreateCQ(4, ch, 0)
		if err != nil {
			t.Fatalf("CQ on the channel after its failed Close: %v", err)
		}
		if err := cq.Close(); err != nil {
			t.Fatal(err)
		}
		if err := ch.Close(); err != nil {
			t.Fatal(err)
		}
		closedNow(t, done, "GetEvents")
	})
}
