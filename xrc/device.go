package xrc

import (
	"fmt"
	"net/netip"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/internal/rdmaaddr"
)

// errUnspecified is the answer to a device endpoint on 0.0.0.0 or :: without
// Config.Device.
var errUnspecified = fmt.Errorf("an endpoint on an RDMA device needs a concrete IP (the one the device holds) or Config.Device: %w", ErrInvalid)

// deviceKernel opens the kernel of the real device that cfg names (Process
// nil): Config.Device, or else the device that holds Addr's IP. It rewrites
// cfg.Addr to the device's address when Addr is unspecified. On a device
// without XRC it fails with an error matching ErrNotSupported that says
// why, having closed everything it opened.
func deviceKernel(cfg *Config) (kernel.Kernel, error) {
	ap, err := parseListenAddr(cfg.Addr)
	if err != nil {
		return nil, &OpError{"listen", cfg.Addr, fmt.Errorf("%w (%w)", err, ErrInvalid)}
	}
	ip, dev := ap.Addr().Unmap(), cfg.Device
	switch {
	case ip.IsUnspecified() && dev == "":
		return nil, &OpError{"listen", cfg.Addr, errUnspecified}
	case ip.IsUnspecified():
		if ip, err = rdmaaddr.AddrOf(dev, ip); err != nil {
			return nil, &OpError{"listen", cfg.Addr, err}
		}
	default:
		on, err := rdmaaddr.DeviceOf(ip)
		if err != nil {
			return nil, &OpError{"listen", cfg.Addr, err}
		}
		if dev != "" && on != dev {
			return nil, &OpError{"listen", cfg.Addr, fmt.Errorf("the address is on device %s, not %s: %w", on, dev, ErrInvalid)}
		}
		dev = on
	}
	cfg.Addr = netip.AddrPortFrom(ip, ap.Port()).String()
	k, err := openDevice(dev, ip)
	if err != nil {
		return nil, &OpError{"listen", cfg.Addr, err}
	}
	return k, nil
}
