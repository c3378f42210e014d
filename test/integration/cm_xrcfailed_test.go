//go:build linux && cgo

package integration

import (
	"context"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/cm"
	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/internal/kernel/hybrid"
	"github.com/goxrc/goxrc/test/softroce"
	"github.com/goxrc/goxrc/verbs"
)

// srqFail is a hybrid process whose first SRQ's receive poll fails (EIO,
// as a driver's failing poll does) once fail is closed: the XRC endpoint
// that made it fails (Err is the poll's error) without a device removal,
// and the process, its CM event channel and its other endpoints live on.
type srqFail struct {
	*hybrid.Process
	mu     sync.Mutex
	victim kernel.SRQ
	set    bool
	fail   chan struct{}
}

func (s *srqFail) CreateSRQ(d kernel.XRCD, slot int) (kernel.SRQ, uint32, error) {
	q, n, err := s.Process.CreateSRQ(d, slot)
	s.mu.Lock()
	if err == nil && !s.set {
		s.victim, s.set = q, true
	}
	s.mu.Unlock()
	return q, n, err
}

func (s *srqFail) PollRecv(ctx context.Context, q kernel.SRQ, out []kernel.RecvCompletion) (int, error) {
	s.mu.Lock()
	mine := s.set && q == s.victim
	s.mu.Unlock()
	if !mine {
		return s.Process.PollRecv(ctx, q, out)
	}
	failed := func() bool {
		select {
		case <-s.fail:
			return true
		default:
			return false
		}
	}
	if failed() {
		return 0, &verbs.OpError{Op: "ibv_poll_cq", Err: syscall.EIO}
	}
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-s.fail:
			cancel()
		case <-pctx.Done():
		}
	}()
	n, err := s.Process.PollRecv(pctx, q, out)
	if n == 0 && failed() {
		return 0, &verbs.OpError{Op: "ibv_poll_cq", Err: syscall.EIO}
	}
	return n, err
}

// TestCMXRCPreferListenerFailedXRCTakesRC: an XRCPrefer listener on a device
// with XRC whose XRC endpoint failed (its receive poll, not the device) goes
// on over RC ("listener's XRC endpoint failed; RC goes on"). The failed
// endpoint kept its XRC and SIDR listening ids in the kernel until the
// listener's Close, so an XRCPrefer dialer's request still reached it: its
// listen loop accepted the connection on an endpoint that receives nothing
// (or, where the endpoint's event channel broke, nothing answered and the
// Dial waited out its deadline). The failure now destroys those ids: the
// dialer's kernel CM answers no listener (REJ reason 8) and the dial falls
// back to the listener's RC at once, where messages echo.
func TestCMXRCPreferListenerFailedXRCTakesRC(t *testing.T) {
	dev, ip := softroce.Device(t)
	base := baseline(t, dev)
	p := xhProc(t, ip)
	fk := &srqFail{Process: p, fail: make(chan struct{})}
	carried := kernel.Carry(fk)
	f := func(device string, local netip.Addr) any {
		if device == dev {
			return carried
		}
		return nil
	}
	kernel.DeviceKernel.Store(&f)
	t.Cleanup(func() { kernel.DeviceKernel.Store(nil) }) // before xhProc's Close
	ctx := cmCtx(t, 90*time.Second)
	var log syncBuffer
	logger := slog.New(slog.NewTextHandler(&log, nil))
	xrcOpts := []cm.Option{cm.WithXRC(cm.XRCPrefer), cm.WithDomainPath(t.TempDir() + "/goxrc"), cm.WithLogger(logger)}
	l, err := cm.Listen(ctx, netip.AddrPortFrom(ip, 0).String(), xrcOpts...) // its endpoint makes the first SRQ
	require.NoError(t, err)
	accepted := echoAll(t, ctx, l) // closes l at the end too

	close(fk.fail)
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(log.String(), "XRC endpoint failed; RC goes on") {
		require.True(t, time.Now().Before(deadline), "the listener's XRC endpoint did not fail: %s", log.String())
		time.Sleep(10 * time.Millisecond)
	}

	dctx, dcancel := context.WithTimeout(ctx, 30*time.Second)
	defer dcancel()
	start := time.Now()
	c, err := cm.Dial(dctx, l.Addr().String(), xrcOpts...)
	took := time.Since(start)
	require.NoError(t, err, "an XRCPrefer dial to a listener whose XRC endpoint failed, after %v", took)
	t.Cleanup(func() { c.Close() }) // closed below; this on a failure
	t.Logf("Dial: %v over %v after %v", c.RemoteAddr(), c.Transport(), took)
	require.Equal(t, cm.TransportRC, c.Transport(), "the dial falls back to the listener's RC, which goes on")
	require.Equal(t, cm.TransportRC, <-accepted)
	require.Contains(t, log.String(), "CM status 8", "the failed endpoint's XRC port has no listener")
	require.Less(t, took, 10*time.Second, "refused at once, not at a timeout")
	exchange(t, ctx, c, c, "over RC beside a failed XRC endpoint")
	require.NoError(t, c.Close())
	require.NoError(t, l.Close())
	kernel.DeviceKernel.Store(nil)
	require.NoError(t, p.Close())
	waitObjects(t, base, 20*time.Second)
}
