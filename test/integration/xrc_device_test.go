//go:build linux && cgo

package integration

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/cm"
	"github.com/goxrc/goxrc/rdmacm"
	"github.com/goxrc/goxrc/test/softroce"
	"github.com/goxrc/goxrc/xrc"
)

// The XRC engine on the VM's device itself (xrc.Config.Process nil, and cm's
// XRC modes). Soft-RoCE has no XRC, so there the endpoint must fail with
// ErrNotSupported and the reason, leaving nothing behind, and cm must keep
// falling back (XRCPrefer) or refusing (XRCRequire). On a device with XRC the
// same tests check that the endpoint runs. Ports: chosen by the system.

// TestXRCDeviceEndpoint: xrc.NewEndpoint without a Process, on the device
// named by its address, by Config.Device with an unspecified address, and
// by both.
func TestXRCDeviceEndpoint(t *testing.T) {
	dev, ip := softroce.Device(t)
	noXRC := deviceNoXRC(t)
	t.Logf("%s: XRC verdict: %v", dev, noXRC)
	base := baseline(t, dev)
	dir := t.TempDir() + "/goxrc"
	ctx := cmCtx(t, 30*time.Second)
	for _, cfg := range []xrc.Config{
		{Addr: netip.AddrPortFrom(ip, 0).String(), DomainDir: dir},
		{Device: dev, Addr: "0.0.0.0:0", DomainDir: dir},
		{Device: dev, Addr: netip.AddrPortFrom(ip, 0).String(), DomainDir: dir},
	} {
		what := fmt.Sprintf("Device %q Addr %s", cfg.Device, cfg.Addr)
		ep, err := xrc.NewEndpoint(ctx, cfg)
		if err == nil {
			t.Cleanup(func() { ep.Close() }) // closed below; this on a failure
		}
		if noXRC == nil {
			require.NoError(t, err, what)
			require.Equal(t, ip, ep.Addr().Addr(), what)
			require.NoError(t, ep.Close(), what)
			continue
		}
		t.Logf("%s: %v", what, err)
		require.ErrorIs(t, err, xrc.ErrNotSupported, what)
		require.ErrorIs(t, err, cm.ErrNotSupported, what)
		require.ErrorContains(t, err, noXRC.Error(), "%s: the error gives the reason", what)
	}
	_, err := xrc.NewEndpoint(ctx, xrc.Config{Device: "nosuch0", Addr: netip.AddrPortFrom(ip, 0).String(), DomainDir: dir})
	require.ErrorContains(t, err, "on device "+dev+", not nosuch0")
	_, err = xrc.NewEndpoint(ctx, xrc.Config{Addr: "0.0.0.0:0", DomainDir: dir})
	require.ErrorContains(t, err, "needs a concrete IP")
	waitObjects(t, base, 5*time.Second)
}

// TestXRCDeviceCM: cm's XRC modes on a device with XRC run over the engine:
// several dials share one dialer endpoint (one uplink), messages echo, and
// everything goes with the last connection and the listener. Skips where the
// device genuinely has no XRC (soft-RoCE); TestCMRequireXRCNotSupported and
// TestCMPreferXRCFallsBackToRC cover that side.
func TestXRCDeviceCM(t *testing.T) {
	dev, ip := softroce.Device(t)
	if noXRC := deviceNoXRC(t); noXRC != nil {
		t.Skipf("the device has no XRC, so cm cannot run XRC on it: %v", noXRC)
	}
	base := baseline(t, dev)
	testCMOverXRC(t, ip, base)
	waitObjects(t, base, 15*time.Second)
}

// testCMOverXRC runs cm's XRC modes on ip's device, which has XRC (or
// runs on a hybrid process: cmHybridDevice): in each mode three dials share
// one dialer endpoint, messages echo, no RC queue pair is made, and a raw
// dial is refused.
func testCMOverXRC(t *testing.T, ip netip.Addr, base objects) {
	dir := t.TempDir() + "/goxrc"
	ctx := cmCtx(t, 60*time.Second)
	for _, mode := range []cm.XRCMode{cm.XRCRequire, cm.XRCPrefer} {
		opts := []cm.Option{cm.WithXRC(mode), cm.WithDomainPath(dir), cm.WithLogger(cmTestLogger(t))}
		l, err := cm.Listen(ctx, netip.AddrPortFrom(ip, 0).String(), opts...)
		require.NoError(t, err, mode)
		echoAll(t, ctx, l) // closes l at the end too: it and the connections are closed below, at a failure there
		var conns []*cm.Conn
		for i := range 3 {
			c, err := cm.Dial(ctx, l.Addr().String(), opts...)
			require.NoError(t, err, "%v dial %d", mode, i)
			t.Cleanup(func() { c.Close() })
			conns = append(conns, c)
			require.Equal(t, cm.TransportXRC, c.Transport())
			require.ErrorIs(t, c.SendWithImm(ctx, []byte("x"), 1), cm.ErrNotSupported)
		}
		buf := make([]byte, 256)
		for i, c := range conns {
			msg := fmt.Sprintf("%v %d over XRC", mode, i)
			require.NoError(t, c.Send(ctx, []byte(msg)))
			n, err := c.Recv(ctx, buf)
			require.NoError(t, err)
			require.Equal(t, msg, string(buf[:n]))
		}
		s := cm.GlobalStats()
		t.Logf("%v: %+v", mode, s)
		require.Positive(t, s.XRCUplinks, "the connections are XRC")
		require.Zero(t, s.QueuePairs-base.cm.QueuePairs, "no RC queue pair")
		for _, c := range conns {
			require.NoError(t, c.Close())
		}
		require.NoError(t, l.Close())
		// Raw messages are RC only: XRCRequire refuses them, XRCPrefer
		// dials over RC (here to the closed listener's free RC port).
		err = failureOf(cm.Dial(ctx, l.Addr().String(), append(opts, cm.WithRawMessages())...))
		if mode == cm.XRCRequire {
			require.ErrorIs(t, err, cm.ErrNotSupported, "raw messages over XRC")
		} else {
			var re *rdmacm.RejectError
			require.ErrorAs(t, err, &re, "a raw XRCPrefer dial goes over RC: %v", err)
		}
	}
}
