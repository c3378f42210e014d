package cm

import (
	"errors"
	"fmt"
	"sync"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/rdmacm"
	"github.com/goxrc/goxrc/verbs"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// checkXRC applies the XRC mode to the device id is bound to, and reports
// whether the connection runs on XRC: it does where the device has XRC and
// the mode is XRCPrefer or XRCRequire. Elsewhere XRCPrefer logs why XRC is
// not used and goes on with RC, and XRCRequire fails with ErrNotSupported
// and the reason.
func (cfg *config) checkXRC(id *rdmacm.ID) (bool, error) {
	if cfg.xrc == XRCOff {
		return false, nil
	}
	if cfg.raw {
		return false, cfg.noXRC(id.DeviceName(), "raw messages are plain sends on RC")
	}
	if testKernel(id) != nil {
		return true, nil
	}
	reason := xrcUnavailable(id)
	if reason == "" {
		return true, nil
	}
	return false, cfg.noXRC(id.DeviceName(), reason)
}

// checkXRCUnbound applies the XRC mode to a listener on an unspecified
// address without WithDevice: it serves every device, and an XRC endpoint
// serves one.
func (cfg *config) checkXRCUnbound() error {
	if cfg.xrc == XRCOff {
		return nil
	}
	return cfg.noXRC("any device", "an XRC listener serves one device: listen on its address or use WithDevice")
}

// noXRC is the answer of XRCRequire (an error) and XRCPrefer (a log line and
// RC) where XRC cannot be used.
func (cfg *config) noXRC(where, reason string) error {
	if cfg.xrc == XRCRequire {
		return fmt.Errorf("XRC on %s: %s: %w", where, reason, ErrNotSupported)
	}
	cfg.logger.Info("XRC unavailable, using RC", "device", where, "reason", reason)
	return nil
}

var xrcProbes sync.Map // device name -> reason string

// xrcUnavailable says why connections on id's device cannot use XRC, or ""
// where they can. The device is probed until the answer is the device's
// (its capability bit, then a private XRC domain): a failure that may pass
// (out of memory, an id with no device yet) is answered, not kept.
func xrcUnavailable(id *rdmacm.ID) string {
	name := id.DeviceName()
	if r, ok := xrcProbes.Load(name); ok {
		return r.(string)
	}
	reason, final := probeXRC(id)
	if final {
		xrcProbes.Store(name, reason)
	}
	return reason
}

// probeXRC probes id's device; final says the answer holds for the device.
func probeXRC(id *rdmacm.ID) (reason string, final bool) {
	vctx := id.VerbsContext()
	if vctx == nil {
		return "the id is not bound to a device", false
	}
	defer vctx.Close()
	attr, err := vctx.QueryDevice()
	if err != nil {
		return "querying the device: " + err.Error(), false
	}
	if !attr.XRC() {
		return "the device does not advertise XRC (IBV_DEVICE_XRC clear)", true
	}
	x, err := vctx.OpenXRCD("", 0)
	if err != nil {
		// EOPNOTSUPP, ENOSYS: the device's; anything else may pass.
		return "ibv_open_xrcd: " + err.Error(), errors.Is(err, verbs.ErrNotSupported)
	}
	x.Close()
	return "", true
}

// testKernel is the kernel a test runs id's device's XRC connections on
// instead of its verbs (kernel.DeviceKernel), or nil.
func testKernel(id *rdmacm.ID) *memfabric.Process {
	f := kernel.DeviceKernel.Load()
	if f == nil {
		return nil
	}
	p, _ := (*f)(id.DeviceName(), id.LocalAddr().Addr()).(*memfabric.Process)
	return p
}
