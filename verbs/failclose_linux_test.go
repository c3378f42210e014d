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
	"github.com/goxrc/goxrc/test/softroce"
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

// An opened XRC target handle is destroyed by the kernel's uverbs command,
// not the provider (QP.Close): that path takes a QP's handle out of the
// kernel. No device here opens XRC handles, so a QP made here stands in for
// one (its provider struct and queue mappings stay behind, as an opened
// handle's struct does).
func TestKernelDestroyOfOpenedHandle(t *testing.T) {
	c := openRXE(t)
	pd, err := c.AllocPD()
	if err != nil {
		t.Fatal(err)
	}
	defer pd.Close()
	cq, err := c.CreateCQ(4, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cq.Close()
	qps := func() uint64 {
		t.Helper()
		rs, err := softroce.ProcessResources(os.Getenv("RXE_DEV"), os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		return rs["qp"]
	}
	before := qps()
	q, err := pd.CreateQP(QPInit{Type: QPTypeRC, SendCQ: cq, RecvCQ: cq, Cap: QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if got := qps(); got != before+1 {
		t.Fatalf("the kernel counts %d QPs with ours, %d before", got, before)
	}
	q.opened = true // destroyed as an opened handle is
	if err := q.Close(); err != nil {
		t.Fatalf("Close by the kernel command: %v", err)
	}
	if got := qps(); got != before {
		t.Fatalf("the kernel counts %d QPs after the destroy, %d before", got, before)
	}
	if err := q.Close(); err != nil {
		t.Fatalf("Close again: %v", err)
	}
}
