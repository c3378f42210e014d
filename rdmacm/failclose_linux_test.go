//go:build linux && cgo

package rdmacm

import (
	"errors"
	"net/netip"
	"syscall"
	"testing"

	"github.com/goxrc/goxrc/internal/faults"
	"github.com/goxrc/goxrc/verbs"
)

// An id whose rdma_destroy_id fails is closed for use but still exists in
// C: it stays counted, holds its channel, and a second Close destroys it.
func TestFailedDestroyIDIsRetried(t *testing.T) {
	ch, err := NewEventChannel()
	if err != nil {
		t.Skipf("no RDMA CM in this kernel (%v): run through the VM harness", err)
	}
	id, err := ch.CreateID(PortSpaceTCP, verbs.QPTypeRC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(faults.Set(faults.FailOnce("rdma_destroy_id", syscall.EIO)))

	err = id.Close()
	var oe *verbs.OpError
	if !errors.Is(err, syscall.EIO) || !errors.As(err, &oe) || oe.Op != "rdma_destroy_id" {
		t.Fatalf("Close with a failing destroy: %v, want rdma_destroy_id's EIO", err)
	}
	if err := id.Bind(netip.MustParseAddrPort("127.0.0.1:0")); !errors.Is(err, ErrClosed) {
		t.Fatalf("Bind after the failed Close: %v, want ErrClosed", err)
	}
	if c := Counts(); c.IDs != 1 || c.Channels != 1 {
		t.Fatalf("after the failed Close: %+v, want the id and its channel counted", c)
	}
	if err := ch.Close(); err != nil {
		t.Fatal(err)
	}
	ch.mu.Lock()
	gone := ch.destroyed
	ch.mu.Unlock()
	if gone || Counts().IDs != 1 {
		t.Fatalf("C channel destroyed under an id that still exists (counts %+v)", Counts())
	}
	if err := id.Close(); err != nil {
		t.Fatalf("Close again: %v", err)
	}
	if err := id.Close(); err != nil {
		t.Fatalf("Close a third time: %v", err)
	}
	if c := Counts(); c != (Counters{}) {
		t.Fatalf("after the retried Close: %+v, want nothing left", c)
	}
}
