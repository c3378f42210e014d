//go:build linux && cgo

package xrc

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/internal/kernel/real"
)

// openDevice opens device dev (address ip) through the real kernel seam and
// checks that XRC works there.
func openDevice(dev string, ip netip.Addr) (kernel.Kernel, error) {
	p, err := real.Open(dev, ip, real.Options{})
	if err != nil {
		return nil, err
	}
	if err := p.CheckXRC(); err != nil {
		p.Close()
		if errors.Is(err, real.ErrNoXRC) {
			return nil, fmt.Errorf("%w: %w", err, ErrNotSupported)
		}
		return nil, err
	}
	return p, nil
}
