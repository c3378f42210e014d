package cm

import (
	"fmt"
	"sync"

	"github.com/goxrc/goxrc/rdmacm"
)

// checkXRC applies the XRC mode to the device id is bound to. Connections
// in this package run on RC: XRCPrefer logs why XRC is not used and goes on,
// XRCRequire fails with ErrNotSupported and the reason.
func (cfg *config) checkXRC(id *rdmacm.ID) error {
	if cfg.xrc == XRCOff {
		return nil
	}
	reason := xrcUnavailable(id)
	if cfg.xrc == XRCRequire {
		return fmt.Errorf("XRC on %s: %s: %w", id.DeviceName(), reason, ErrNotSupported)
	}
	cfg.logger.Info("XRC unavailable, using RC", "device", id.DeviceName(), "reason", reason)
	return nil
}

var xrcProbes sync.Map // device name -> reason string

// xrcUnavailable says why connections on id's device cannot use XRC. The
// device is probed once: its capability bit, then a private XRC domain.
func xrcUnavailable(id *rdmacm.ID) string {
	name := id.DeviceName()
	if r, ok := xrcProbes.Load(name); ok {
		return r.(string)
	}
	reason := probeXRC(id)
	xrcProbes.Store(name, reason)
	return reason
}

func probeXRC(id *rdmacm.ID) string {
	vctx := id.Context()
	if vctx == nil {
		return "the id is not bound to a device"
	}
	defer vctx.Close()
	attr, err := vctx.QueryDevice()
	if err != nil {
		return "querying the device: " + err.Error()
	}
	if !attr.XRC() {
		return "the device does not advertise XRC (IBV_DEVICE_XRC clear)"
	}
	x, err := vctx.OpenXRCD("", 0)
	if err != nil {
		return "ibv_open_xrcd: " + err.Error()
	}
	x.Close()
	return "XRC connections on hardware devices are not wired into package cm yet (see package xrc)"
}
