//go:build linux && cgo

package kcm

import (
	"net/netip"
	"syscall"
	"testing"

	"github.com/goxrc/goxrc/internal/faults"
	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/rdmacm"
)

// A DestroyID whose rdma_destroy_id fails keeps the handle, so a retry
// destroys the id; Close leaves nothing behind. Runs in the VM of
// test/vm/rxe-vm.sh; skips elsewhere.
func TestDestroyIDFailureIsRetried(t *testing.T) {
	ip := rxeIP(t)
	before := rdmacm.Counts()
	c, err := New(ip)
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.Listen(netip.AddrPortFrom(ip, 20351), kernel.ExchangeSIDR)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(faults.Set(faults.FailOnce("rdma_destroy_id", syscall.EIO)))
	if err := c.DestroyID(l); err == nil {
		t.Fatal("DestroyID with a failing destroy succeeded")
	}
	if err := c.DestroyID(l); err != nil {
		t.Fatalf("DestroyID again: %v", err)
	}
	if err := c.DestroyID(l); err == nil {
		t.Fatal("a destroyed handle destroyed again")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if got := rdmacm.Counts(); got != before {
		t.Fatalf("rdmacm counts %+v after Close, want %+v", got, before)
	}
}
