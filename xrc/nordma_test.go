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

// The same with Config.Device and an unspecified Addr, where the endpoint
// looks up the device's own address first: that look-up opened the device,
// whose error on a kernel without RDMA ("no RDMA support in this kernel")
// was flattened into "no such RDMA device" (ENODEV), and matched neither
// ErrNotSupported nor anything else a caller could tell "no RDMA here" by.
func TestNoRDMAIsNotSupportedWithDevice(t *testing.T) {
	if _, err := os.Stat("/dev/infiniband/rdma_cm"); err == nil {
		t.Skip("this machine has an RDMA CM")
	}
	for _, addr := range []string{"0.0.0.0:7000", "[::]:7000", "10.1.2.3:7000"} {
		_, err := NewEndpoint(context.Background(), Config{Device: "mlx5_0", Addr: addr, DomainDir: t.TempDir()})
		if !errors.Is(err, ErrNotSupported) {
			t.Errorf("Device mlx5_0, Addr %s: %v, want it to match ErrNotSupported", addr, err)
		}
	}
}
