//go:build linux && cgo

package integration

import (
	"context"
	"log/slog"
	"net/netip"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/cm"
	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/rdmacm"
	"github.com/goxrc/goxrc/test/softroce"
	"github.com/goxrc/goxrc/verbs"
)

// cm's XRC modes as on a device with XRC, with the real kernel CM:
// kernel.DeviceKernel gives cm a process of the hybrid fabric (xhFabric: the
// real CM on soft-RoCE, the model's XRC QPs) for the device's XRC
// connections, so cm's choices for a device with XRC (an XRCPrefer listener
// that takes RC dialers too, an XRCPrefer dial that falls back to RC) meet
// the kernel's own answers. RC connections beside them are real rxe ones.
// Ports: chosen by the system.

// cmHybridDevice makes cm run the XRC connections of ip's device on a new
// hybrid process until done, which closes the process (its kcm keeps a
// resolved SIDR id per destination until then). It returns the leak
// baseline, taken before the process opened.
func cmHybridDevice(t *testing.T) (ip netip.Addr, base objects, done func()) {
	dev, ip := softroce.Device(t)
	base = baseline(t, dev)
	p := xhProc(t, ip)
	carried := kernel.Carry(p)
	f := func(device string, local netip.Addr) any {
		if device == dev {
			return carried
		}
		return nil
	}
	kernel.DeviceKernel.Store(&f)
	done = func() {
		kernel.DeviceKernel.Store(nil)
		require.NoError(t, p.Close())
	}
	t.Cleanup(func() { kernel.DeviceKernel.Store(nil) }) // before xhProc's Close
	return ip, base, done
}

// echoAll accepts on l until it closes, echoes every message on each
// connection, and reports each accepted connection's transport (the first
// 16 not yet taken; later ones are dropped). When the test ends (before the
// cleanups registered until now, such as the hybrid process's Close) l is
// closed and the accepted connections are, within the test: a failure must
// not leave them to close in a later test's leak check.
func echoAll(t *testing.T, ctx context.Context, l *cm.Listener) <-chan cm.Transport {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	t.Cleanup(func() { l.Close(); cancel(); wg.Wait() })
	got := make(chan cm.Transport, 16)
	wg.Go(func() {
		for {
			c, err := l.Accept(ctx)
			if err != nil {
				return
			}
			select {
			case got <- c.Transport():
			default:
			}
			wg.Go(func() {
				defer c.Close()
				buf := make([]byte, 256)
				for {
					n, err := c.Recv(ctx, buf)
					if err != nil || c.Send(ctx, buf[:n]) != nil {
						return
					}
				}
			})
		}
	})
	return got
}

// TestCMXRCPreferListenerTakesRC: an XRCPrefer listener on a device with XRC
// also listens for RC on its port: an XRCOff dialer gets an RC connection
// and an XRCPrefer one an XRC connection, through one Accept. Closing it
// frees the RC port at once (an RC listener binds it while the accepted XRC
// connection keeps the XRC endpoint), and an XRCPrefer Listen on the port
// takes both again. An XRCRequire listener refuses RC dialers as no
// listener.
func TestCMXRCPreferListenerTakesRC(t *testing.T) {
	ip, base, done := cmHybridDevice(t)
	ctx := cmCtx(t, 90*time.Second)
	logger := cmTestLogger(t)
	xrcOpts := []cm.Option{cm.WithXRC(cm.XRCPrefer), cm.WithDomainPath(t.TempDir() + "/goxrc"), cm.WithLogger(logger)}
	l, err := cm.Listen(ctx, netip.AddrPortFrom(ip, 0).String(), xrcOpts...)
	require.NoError(t, err)
	addr := l.Addr().String()
	accepted := echoAll(t, ctx, l) // closes l at the end too: the listeners and connections are closed below, at a failure there

	rc, err := cm.Dial(ctx, addr, cm.WithLogger(logger))
	require.NoError(t, err, "an XRCOff dial to an XRCPrefer listener")
	t.Cleanup(func() { rc.Close() })
	require.Equal(t, cm.TransportRC, rc.Transport())
	require.Equal(t, cm.TransportRC, <-accepted)
	exchange(t, ctx, rc, rc, "over RC")
	x, err := cm.Dial(ctx, addr, xrcOpts...)
	require.NoError(t, err, "an XRCPrefer dial to an XRCPrefer listener")
	t.Cleanup(func() { x.Close() })
	require.Equal(t, cm.TransportXRC, x.Transport())
	require.Equal(t, cm.TransportXRC, <-accepted)
	exchange(t, ctx, x, x, "over XRC")
	s := cm.GlobalStats()
	t.Logf("stats: %+v", s)
	require.Equal(t, int64(2), s.QueuePairs-base.cm.QueuePairs, "one RC connection: its two ends' QPs")
	require.Positive(t, s.XRCUplinks, "the XRC connection runs on an uplink")
	require.NoError(t, rc.Close())

	require.NoError(t, l.Close())
	err = failureOf(cm.Dial(ctx, addr, cm.WithLogger(logger)))
	var re *rdmacm.RejectError
	require.ErrorAs(t, err, &re, "an RC dial after Close: %v", err)
	exchange(t, ctx, x, x, "the XRC connection stays")
	rl, err := cm.Listen(ctx, addr, cm.WithLogger(logger))
	require.NoError(t, err, "the RC port is free once the listener closes")
	require.NoError(t, rl.Close())
	l, err = cm.Listen(ctx, addr, xrcOpts...)
	require.NoError(t, err, "an XRCPrefer listener takes the port back")
	accepted = echoAll(t, ctx, l)
	rc, err = cm.Dial(ctx, addr, cm.WithLogger(logger)) // the first rc closed: rc's cleanup closes this one
	require.NoError(t, err)
	require.Equal(t, cm.TransportRC, <-accepted)
	exchange(t, ctx, rc, rc, "over RC again")
	require.NoError(t, rc.Close())
	require.NoError(t, x.Close())
	require.NoError(t, l.Close())

	req, err := cm.Listen(ctx, netip.AddrPortFrom(ip, 0).String(), append(xrcOpts, cm.WithXRC(cm.XRCRequire))...)
	require.NoError(t, err)
	t.Cleanup(func() { req.Close() })
	err = failureOf(cm.Dial(ctx, req.Addr().String(), cm.WithLogger(logger)))
	require.ErrorAs(t, err, &re, "an RC dial to an XRCRequire listener: %v", err)
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
	require.NoError(t, req.Close())
	done()
	waitObjects(t, base, 20*time.Second)
}

// TestCMXRCPreferDialFallsBackToRC: an XRCPrefer dial on a device with XRC
// to an RC-only listener goes on over RC once the peer's kernel CM answers
// that nothing listens for XRC on the port: a REJ (reason 8) to the
// physical request before an uplink to the node is up, a SIDR REP (status
// 1) to the virtual request once one is. The refusal is remembered: the
// next dial there goes over RC without asking, until an RC dial there
// fails (the port now has an XRCRequire listener), after which the next
// dial asks again and gets XRC.
func TestCMXRCPreferDialFallsBackToRC(t *testing.T) {
	ip, base, done := cmHybridDevice(t)
	ctx := cmCtx(t, 90*time.Second)
	var log syncBuffer
	logger := slog.New(slog.NewTextHandler(&log, nil))
	asked := func() int { return strings.Count(log.String(), "XRC unavailable, using RC") }
	xrcOpts := []cm.Option{cm.WithXRC(cm.XRCPrefer), cm.WithDomainPath(t.TempDir() + "/goxrc"), cm.WithLogger(logger)}
	rcListen := func() (*cm.Listener, <-chan cm.Transport) {
		l, err := cm.Listen(ctx, netip.AddrPortFrom(ip, 0).String(), cm.WithLogger(logger))
		require.NoError(t, err)
		return l, echoAll(t, ctx, l) // which closes l at the end too
	}
	dialRC := func(l *cm.Listener, accepted <-chan cm.Transport) {
		t.Helper()
		c, err := cm.Dial(ctx, l.Addr().String(), xrcOpts...)
		require.NoError(t, err)
		defer c.Close() // closed below; this on a failure
		require.Equal(t, cm.TransportRC, c.Transport())
		require.Equal(t, cm.TransportRC, <-accepted)
		exchange(t, ctx, c, c, "fell back to RC")
		require.NoError(t, c.Close())
	}
	rl, rlAccepted := rcListen()
	dialRC(rl, rlAccepted) // no uplink to the node yet: a physical request
	require.Equal(t, 1, asked())
	require.Contains(t, log.String(), "CM status 8", "the log says why")
	dialRC(rl, rlAccepted)
	require.Equal(t, 1, asked(), "the refusal is remembered")

	xl, err := cm.Listen(ctx, netip.AddrPortFrom(ip, 0).String(), xrcOpts...)
	require.NoError(t, err)
	xAccepted := echoAll(t, ctx, xl)
	x, err := cm.Dial(ctx, xl.Addr().String(), xrcOpts...)
	require.NoError(t, err)
	t.Cleanup(func() { x.Close() }) // closed below; this on a failure
	require.Equal(t, cm.TransportXRC, x.Transport())
	require.Equal(t, cm.TransportXRC, <-xAccepted)
	uplinks := cm.GlobalStats().XRCUplinks
	require.Positive(t, uplinks-base.cm.XRCUplinks)
	rl2, rl2Accepted := rcListen()
	dialRC(rl2, rl2Accepted) // over the uplink x brought up: a virtual request
	require.Equal(t, 2, asked())
	require.Contains(t, log.String(), "CM status 1", "the log says why")
	require.Equal(t, uplinks, cm.GlobalStats().XRCUplinks, "no uplink for the RC listener")

	// rl's port now takes XRC only: the remembered refusal sends the next
	// dial over RC, which fails, and is forgotten.
	addr := rl.Addr().String()
	require.NoError(t, rl.Close())
	req, err := cm.Listen(ctx, addr, append(xrcOpts, cm.WithXRC(cm.XRCRequire))...)
	require.NoError(t, err)
	reqAccepted := echoAll(t, ctx, req)
	err = failureOf(cm.Dial(ctx, addr, xrcOpts...))
	var re *rdmacm.RejectError
	require.ErrorAs(t, err, &re, "RC, on the remembered refusal: %v", err)
	c, err := cm.Dial(ctx, addr, xrcOpts...)
	require.NoError(t, err, "asked again")
	t.Cleanup(func() { c.Close() })
	require.Equal(t, cm.TransportXRC, c.Transport())
	require.Equal(t, cm.TransportXRC, <-reqAccepted)
	exchange(t, ctx, c, c, "XRC after all")
	require.NoError(t, c.Close())
	require.NoError(t, x.Close())
	require.NoError(t, req.Close())
	require.NoError(t, xl.Close())
	require.NoError(t, rl2.Close())
	done()
	waitObjects(t, base, 20*time.Second)
}

// TestCMXRCPreferListenerPortZeroRetries: an XRCPrefer listener on port 0
// takes the port the kernel gives its RC id for its XRC endpoint too; where
// that number is taken in the XRC endpoint's port spaces, it binds another.
// The kernel's ephemeral range is narrowed to two numbers for the test, the
// lower one held in RDMA_PS_UDP; the kernel does not give the number it
// gave last again at once (cma_alloc_any_port), so every Listen after the
// first meets the held number first. A fixed port that is taken fails.
func TestCMXRCPreferListenerPortZeroRetries(t *testing.T) {
	ip, base, done := cmHybridDevice(t)
	ctx := cmCtx(t, 60*time.Second)
	const rangeFile = "/proc/sys/net/ipv4/ip_local_port_range"
	old, err := os.ReadFile(rangeFile)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(rangeFile, []byte("40000 40001"), 0o644))
	t.Cleanup(func() { os.WriteFile(rangeFile, old, 0o644) })
	ch, err := rdmacm.NewEventChannel()
	require.NoError(t, err)
	t.Cleanup(func() { ch.Close() }) // both closed below; this on a failure
	held, err := ch.CreateID(rdmacm.PortSpaceUDP, verbs.QPTypeUD)
	require.NoError(t, err)
	t.Cleanup(func() { held.Close() })
	require.NoError(t, held.Bind(netip.AddrPortFrom(ip, 40000)))

	opts := []cm.Option{cm.WithXRC(cm.XRCPrefer), cm.WithDomainPath(t.TempDir() + "/goxrc"), cm.WithLogger(cmTestLogger(t))}
	for i := range 4 {
		l, err := cm.Listen(ctx, netip.AddrPortFrom(ip, 0).String(), opts...)
		require.NoError(t, err, "listen %d", i)
		t.Cleanup(func() { l.Close() }) // closed below; this on a failure
		require.Equal(t, uint16(40001), netip.MustParseAddrPort(l.Addr().String()).Port(), "listen %d", i)
		require.NoError(t, l.Close())
		// The device stays open while idle, and the id that anchors it
		// holds a port of the two.
		cm.CloseIdleDevices()
	}
	err = failureOf(cm.Listen(ctx, netip.AddrPortFrom(ip, 40000).String(), opts...))
	require.ErrorIs(t, err, syscall.EADDRINUSE, "a fixed port taken in RDMA_PS_UDP")
	require.NoError(t, held.Close())
	require.NoError(t, ch.Close())
	done()
	waitObjects(t, base, 20*time.Second)
}

// TestCMXRCOverRealCM: cm's XRC suite of a device with XRC (testCMOverXRC,
// which TestXRCDeviceCM runs on such a device), and net/http over XRC
// connections, with the real kernel CM carrying every exchange.
func TestCMXRCOverRealCM(t *testing.T) {
	ip, base, done := cmHybridDevice(t)
	testCMOverXRC(t, ip, base)
	before := cm.GlobalStats()
	testHTTPOverNetConn(t, cm.WithXRC(cm.XRCRequire), cm.WithDomainPath(t.TempDir()+"/goxrc"))
	after := cm.GlobalStats()
	require.Equal(t, before.QueuePairs, after.QueuePairs, "no RC queue pair: HTTP ran over XRC")
	require.Greater(t, after.ConnectionsTotal, before.ConnectionsTotal)
	done()
	waitObjects(t, base, 20*time.Second)
}
