//go:build !linux || !cgo

package xrc

import (
	"fmt"
	"net/netip"

	"github.com/goxrc/goxrc/internal/kernel"
)

// openDevice: real RDMA devices need Linux and cgo.
func openDevice(dev string, _ netip.Addr) (kernel.Kernel, error) {
	return nil, fmt.Errorf("device %s: RDMA devices need Linux and cgo: %w", dev, ErrNotSupported)
}
