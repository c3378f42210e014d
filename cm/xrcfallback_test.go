package cm

import (
	"context"
	"log/slog"
	"net/netip"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/xrc"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// preferCfg is a Dial's configuration in mode on the fabric process p, its
// log going to log, and the site of its dialer endpoint.
func preferCfg(t *testing.T, p *memfabric.Process, mode XRCMode, log *strings.Builder) (config, xrcSite) {
	t.Helper()
	cfg, err := newConfig([]Option{WithXRC(mode), WithDomainPath(filepath.Join(t.TempDir(), "d")),
		WithLogger(slog.New(slog.NewTextHandler(log, nil)))})
	require.NoError(t, err)
	cfg.fabric = p
	return cfg, cfg.fabricSite(p.Node().Addr())
}

// rawListener listens on addr of p's kernel for ex (a listener that is no
// XRC endpoint: kernel.ExchangeRC is RDMA_PS_TCP, as cm's RC listeners and
// most librdmacm servers), answers every request with a reject without
// private data, and reports how many requests it saw.
func rawListener(t *testing.T, p *memfabric.Process, addr netip.AddrPort, ex kernel.Exchange) func() int {
	t.Helper()
	k, ok := kernel.Unwrap(p)
	require.True(t, ok)
	l, err := k.Listen(addr, ex)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	seen := make(chan int, 1)
	seen <- 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			ev, err := k.Event(ctx, l)
			if err != nil {
				return
			}
			if ev.Type == kernel.EventConnectRequest {
				seen <- <-seen + 1
				k.Reject(ev.ID, nil)
				k.DestroyID(ev.ID)
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		<-done
		k.DestroyID(l)
	})
	return func() int { n := <-seen; seen <- n; return n }
}

// XRCPrefer to a port where only an RC listener listens (RDMA_PS_TCP): the
// physical link's XRC-typed REQ, in RDMA_PS_IB, meets no listener of its
// port space and the peer's CM refuses it with REJ reason 8, which is what
// TestHybridDialRCListenerRefused (xrc, VM) sees through the real kernel
// CM. Prefer then goes on over RC, logging why; Require fails with that
// refusal, as before. Until this test the Prefer Dial failed too.
func TestXRCPreferRCListenerFallsBack(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f := newFabric(t)
	rcNode := f.Node("10.1.0.1").Process()
	rc := netip.MustParseAddrPort("10.1.0.1:7471")
	requests := rawListener(t, rcNode, rc, kernel.ExchangeRC)

	var log strings.Builder
	cfg, site := preferCfg(t, f.Node("10.1.0.2").Process(), XRCPrefer, &log)
	c, useRC, err := dialXRCPrefer(ctx, rc, cfg, site)
	require.NoError(t, err)
	require.Nil(t, c)
	require.True(t, useRC, "XRCPrefer to an RC-only listener goes on over RC")
	require.Contains(t, log.String(), "XRC unavailable, using RC")
	require.Contains(t, log.String(), "CM status 8")
	require.Contains(t, log.String(), "remote=10.1.0.1:7471")

	log.Reset()
	cfg, site = preferCfg(t, f.Node("10.1.0.3").Process(), XRCRequire, &log)
	c, useRC, err = dialXRCPrefer(ctx, rc, cfg, site)
	require.Nil(t, c)
	require.False(t, useRC)
	var re *xrc.RejectError
	require.ErrorAs(t, err, &re)
	require.Equal(t, xrc.RejectNoListener, re.Reason)
	require.Equal(t, kernel.RejInvalidServiceID, re.Status)
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
	require.Empty(t, log.String(), "XRCRequire does not fall back")
	require.Zero(t, requests(), "the RC listener never sees an XRC request")
}

// The same over a live uplink: the dialer endpoint already has one to the
// RC listener's node (an XRC listener of another process there), so the
// Dial asks by a virtual link, a SIDR REQ in RDMA_PS_UDP, which the peer's
// CM answers with SIDR status 1 (unsupported: no listener).
func TestXRCPreferRCListenerFallsBackOverUplink(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f := newFabric(t)
	node := f.Node("10.1.0.1")
	xl, err := Listen(ctx, "10.1.0.1:7000", WithFabric(node.Process()), WithDomainPath(filepath.Join(t.TempDir(), "l")))
	require.NoError(t, err)
	defer xl.Close()
	go func() {
		for {
			c, err := xl.Accept(ctx)
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	rc := netip.MustParseAddrPort("10.1.0.1:7471")
	requests := rawListener(t, node.Process(), rc, kernel.ExchangeRC)

	var log strings.Builder
	cfg, site := preferCfg(t, f.Node("10.1.0.2").Process(), XRCPrefer, &log)
	x, err := dialXRC(ctx, netip.MustParseAddrPort("10.1.0.1:7000"), cfg, site)
	require.NoError(t, err, "the XRC listener")
	defer x.Close()
	phys := xrcStats().Uplinks
	c, useRC, err := dialXRCPrefer(ctx, rc, cfg, site)
	require.NoError(t, err)
	require.Nil(t, c)
	require.True(t, useRC)
	require.Contains(t, log.String(), "XRC unavailable, using RC")
	require.Contains(t, log.String(), "CM status 1", "refused by SIDR, over the uplink: %s", log.String())
	require.Equal(t, phys, xrcStats().Uplinks, "no new uplink")
	require.Zero(t, requests())
}

// What is not the peer's CM saying that nothing listens for XRC leaves an
// XRCPrefer Dial failed, with no RC try and nothing logged: an XRC
// endpoint's own reject (a dial-only endpoint's APP_REJECT), a
// zero-data reject of the CM's (reason 28: an RC listener in RDMA_PS_IB
// refusing the XRC QP type, or any rdma_reject), a SIDR reject, and a
// request nobody answers (a node powered off).
func TestXRCPreferNoFallbackWithoutSignal(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	f := newFabric(t)
	peer := f.Node("10.1.0.1")
	dialOnly, err := xrc.NewEndpoint(ctx, xrc.Config{Process: peer.Process(), Addr: "10.1.0.1:7001",
		DomainDir: filepath.Join(t.TempDir(), "p"), DialOnly: true})
	require.NoError(t, err)
	defer dialOnly.Close()
	ibrc := rawListener(t, peer.Process(), netip.MustParseAddrPort("10.1.0.1:7002"), kernel.ExchangeIBRC)
	xrcRaw := rawListener(t, peer.Process(), netip.MustParseAddrPort("10.1.0.1:7003"), kernel.ExchangeXRC)
	f.Node("10.1.0.9").PowerOff()

	for _, tc := range []struct {
		addr    string
		reason  xrc.RejectReason
		status  int
		timeout bool
	}{
		{addr: "10.1.0.1:7001", reason: xrc.RejectApp},
		{addr: "10.1.0.1:7002", reason: xrc.RejectCM, status: kernel.RejConsumerDefined},
		{addr: "10.1.0.1:7003", reason: xrc.RejectCM, status: kernel.RejConsumerDefined},
		{addr: "10.1.0.9:7471", timeout: true},
	} {
		var log strings.Builder
		cfg, site := preferCfg(t, f.Node("10.1.0.2").Process(), XRCPrefer, &log)
		dctx := ctx
		if tc.timeout {
			var dcancel context.CancelFunc
			dctx, dcancel = context.WithTimeout(ctx, 300*time.Millisecond)
			defer dcancel()
		}
		c, useRC, err := dialXRCPrefer(dctx, netip.MustParseAddrPort(tc.addr), cfg, site)
		t.Logf("%s: %v", tc.addr, err)
		require.Nil(t, c, tc.addr)
		require.False(t, useRC, tc.addr)
		require.Error(t, err, tc.addr)
		require.Empty(t, log.String(), tc.addr)
		if tc.timeout {
			require.ErrorIs(t, err, context.DeadlineExceeded, tc.addr)
			continue
		}
		var re *xrc.RejectError
		require.ErrorAs(t, err, &re, tc.addr)
		require.Equal(t, tc.reason, re.Reason, tc.addr)
		if tc.status != 0 {
			require.Equal(t, tc.status, re.Status, tc.addr)
		}
	}
	require.Zero(t, ibrc(), "the CM refuses the QP type before the listener hears of it")
	require.Equal(t, 1, xrcRaw(), "the XRC-typed listener rejected the one request itself")
}

// The sign itself: only the CM's no-listener statuses, never the engine's
// other reasons or an unanswered request.
func TestPeerWithoutXRC(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{&xrc.RejectError{Reason: xrc.RejectNoListener, Status: kernel.RejInvalidServiceID}, true},
		{opError("dial", nil, &xrc.RejectError{Reason: xrc.RejectNoListener, Status: kernel.SIDRNoListener}), true},
		{&xrc.RejectError{Reason: xrc.RejectCM, Status: kernel.RejConsumerDefined}, false},
		{&xrc.RejectError{Reason: xrc.RejectNoXRC}, false},
		{&xrc.RejectError{Reason: xrc.RejectApp}, false},
		{&xrc.RejectError{Reason: xrc.RejectBusyRetry}, false},
		{&xrc.RejectError{Reason: xrc.RejectCM, Status: -int(syscall.ETIMEDOUT)}, false},
		{context.DeadlineExceeded, false},
		{syscall.ECONNREFUSED, false},
	} {
		require.Equal(t, tc.want, peerWithoutXRC(tc.err) != "", "%v", tc.err)
	}
}

// An XRCPrefer Dial refused as meeting no XRC listener is remembered for
// noXRCMemory: the next Dial from the same site to the same address goes
// over RC without asking (no second request, no second log line), a Dial
// from another site or to another address asks, and a forgotten or expired
// refusal is asked again.
func TestXRCPreferRemembersRefusal(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f := newFabric(t)
	rcNode := f.Node("10.1.0.1").Process()
	rc := netip.MustParseAddrPort("10.1.0.1:7471")
	rc2 := netip.MustParseAddrPort("10.1.0.1:7472")
	rawListener(t, rcNode, rc, kernel.ExchangeRC)
	rawListener(t, rcNode, rc2, kernel.ExchangeRC)
	var log strings.Builder
	cfg, site := preferCfg(t, f.Node("10.1.0.2").Process(), XRCPrefer, &log)
	asked := func() int { return strings.Count(log.String(), "XRC unavailable, using RC") }
	dial := func(dst netip.AddrPort, cfg config, site xrcSite) {
		t.Helper()
		c, useRC, err := dialXRCPrefer(ctx, dst, cfg, site)
		require.NoError(t, err)
		require.Nil(t, c)
		require.True(t, useRC)
	}
	dial(rc, cfg, site)
	require.Equal(t, 1, asked())
	dial(rc, cfg, site)
	require.Equal(t, 1, asked(), "remembered: not asked again")
	dial(rc2, cfg, site)
	require.Equal(t, 2, asked(), "another port is asked")
	var log2 strings.Builder
	cfg2, site2 := preferCfg(t, f.Node("10.1.0.3").Process(), XRCPrefer, &log2)
	dial(rc, cfg2, site2)
	require.Contains(t, log2.String(), "XRC unavailable, using RC", "another site asks")

	forgetNoXRC(site, rc) // as a failed RC dial does
	dial(rc, cfg, site)
	require.Equal(t, 3, asked(), "asked again once forgotten")
	defer func(d time.Duration) { noXRCMemory = d }(noXRCMemory)
	noXRCMemory = 0
	dial(rc2, cfg, site) // still remembered from before
	require.Equal(t, 3, asked())
	forgetNoXRC(site, rc2)
	dial(rc2, cfg, site) // remembered until now: expired at once
	dial(rc2, cfg, site)
	require.Equal(t, 5, asked(), "asked again once expired")
}
