//go:build linux && cgo

package xrc

import (
	"context"
	"errors"
	"os"
	"testing"
)

// Where the kernel has no RDMA CM, an endpoint on a device fails with
// ErrNotSupported (the platform lacks RDMA altogether), as cm's Dial and
// Listen do; it said "no such device" about /dev/infiniband/rdma_cm, so
// that a test skipping on ErrNotSupported failed on such a machine instead.
func TestNoRDMAIsNotSupported(t *testing.T) {
	if _, err := os.Stat("/dev/infiniband/rdma_cm"); err == nil {
		t.Skip("this machine has an RDMA CM")
	}
	_, err := NewEndpoint(context.Background(), Config{Addr: "10.1.2.3:7000", DomainDir: t.TempDir()})
	if !errors.Is(err, ErrNotSupported) {
		t.Fatalf("%v, want it to match ErrNotSupported", err)
	}
}
