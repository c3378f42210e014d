package cm

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/nettest"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/xrc"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// A Dial that joins an open shared dialer endpoint checks its options as
// the first did: WithRawMessages (and WithXRC(XRCOff) on the fabric) are
// refused, not accepted and ignored (as they were).
func TestFabricRawJoiningSharedEndpointRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f := newFabric(t)
	srv, cli := f.Node("10.1.0.1").Process(), f.Node("10.1.0.2").Process()
	dom := filepath.Join(t.TempDir(), "xrc")
	c, _ := fabricPair(ctx, t, srv, cli, nil, []Option{WithDomainPath(dom)}) // opens cli's shared dialer endpoint
	addr := c.RemoteAddr().String()
	// The very same call fails while no endpoint exists ...
	_, err := Dial(ctx, addr, WithFabric(f.Node("10.1.0.3").Process()), WithDomainPath(dom), WithRawMessages())
	require.ErrorIs(t, err, ErrNotSupported, "no shared endpoint yet: refused")
	// ... and succeeds once one does.
	raw, err := Dial(ctx, addr, WithFabric(cli), WithDomainPath(dom), WithRawMessages())
	if err == nil {
		defer raw.Close()
	}
	require.ErrorIs(t, err, ErrNotSupported, "raw over XRC must be refused whether or not the endpoint exists")
}

func TestFabricXRCOffJoiningSharedEndpointRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f := newFabric(t)
	srv, cli := f.Node("10.1.0.1").Process(), f.Node("10.1.0.2").Process()
	dom := filepath.Join(t.TempDir(), "xrc")
	c, _ := fabricPair(ctx, t, srv, cli, nil, []Option{WithDomainPath(dom)}) // opens cli's shared dialer endpoint
	off, err := Dial(ctx, c.RemoteAddr().String(), WithFabric(cli), WithDomainPath(dom), WithXRC(XRCOff))
	if err == nil {
		defer off.Close()
	}
	require.ErrorContains(t, err, "XRC connections only")
}

// GlobalStats().XRCKernelHandles counts a kernel's handles once, however
// many endpoints run on it (two endpoints on one process counted twice).
func TestFabricKernelHandlesCountedOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f := newFabric(t)
	p := f.Node("10.1.0.1").Process()
	dom := filepath.Join(t.TempDir(), "xrc")
	before := GlobalStats().XRCKernelHandles
	l1, err := Listen(ctx, "10.1.0.1:0", WithFabric(p), WithDomainPath(dom))
	require.NoError(t, err)
	defer l1.Close()
	l2, err := Listen(ctx, "10.1.0.1:0", WithFabric(p), WithDomainPath(dom))
	require.NoError(t, err)
	defer l2.Close()
	got := GlobalStats().XRCKernelHandles - before
	t.Logf("process holds %d handles; GlobalStats says %d", p.Handles(), got)
	require.Equal(t, p.Handles(), got)
}

// noHandles is a kernel that cannot count its handles (the seam allows it;
// the real one counts since the thirty-second session): Stats reports -1.
type noHandles struct{ kernel.Kernel }

func TestFabricKernelHandlesUnknownNotNegative(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f := newFabric(t)
	k, ok := kernel.Unwrap(f.Node("10.1.0.1").Process())
	require.True(t, ok)
	fake := &memfabric.Process{} // memfabric's unwrapper declines it (no model process)
	kernel.RegisterUnwrapper(func(v any) (kernel.Kernel, bool) {
		if v == any(fake) {
			return noHandles{k}, true
		}
		return nil, false
	})
	dom := filepath.Join(t.TempDir(), "xrc")
	before := GlobalStats().XRCKernelHandles
	for range 3 {
		l, err := Listen(ctx, "10.1.0.1:0", WithFabric(fake), WithDomainPath(dom))
		require.NoError(t, err)
		defer l.Close()
	}
	got := GlobalStats().XRCKernelHandles - before
	require.GreaterOrEqual(t, got, 0, "three endpoints on kernels that cannot count handles")
}

// The LocalAddr of a dialed XRC Conn (and the RemoteAddr of the accepted
// one) is the dialer endpoint's address. Nobody Accepts there: a Dial to
// it is refused (it succeeded, and what was sent on it went nowhere).
func TestFabricDialBackToDialerRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f := newFabric(t)
	srv, cli := f.Node("10.1.0.1").Process(), f.Node("10.1.0.2").Process()
	_, s := fabricPair(ctx, t, srv, cli, nil, nil)
	back, err := Dial(ctx, s.RemoteAddr().String(), WithFabric(srv), WithDomainPath(filepath.Join(t.TempDir(), "x")),
		WithHandshakeTimeout(2*time.Second))
	if err == nil {
		defer back.Close()
		sent := 0
		for i := 0; i < 200; i++ {
			sctx, c := context.WithTimeout(ctx, 200*time.Millisecond)
			err := back.Send(sctx, []byte("hello?"))
			c()
			if err != nil {
				t.Logf("send %d: %v", i, err)
				break
			}
			sent++
		}
		t.Fatalf("Dial to %s (no Listener there) succeeded; %d messages accepted into a void", s.RemoteAddr(), sent)
	}
}

// Data sent before Close arrives before EOF when the Close is the
// last on the shared dialer endpoint (which then closes).
func TestFabricCloseLastConnKeepsData(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	f := newFabric(t)
	srv, cli := f.Node("10.1.0.1").Process(), f.Node("10.1.0.2").Process()
	opts := []Option{WithQueueDepth(8)}
	c, s := fabricPair(ctx, t, srv, cli, opts, opts)
	const n = 8
	for i := range n {
		require.NoError(t, c.Send(ctx, []byte{byte(i)}))
	}
	require.NoError(t, c.Close())
	time.Sleep(100 * time.Millisecond)
	buf := make([]byte, 64)
	for i := range n {
		k, err := s.Recv(ctx, buf)
		require.NoError(t, err, "message %d", i)
		require.Equal(t, []byte{byte(i)}, buf[:k])
	}
	_, err := s.Recv(ctx, buf)
	require.ErrorIs(t, err, io.EOF)
}

// slowKernel takes its time destroying an SRQ, as teardown on a device can.
type slowKernel struct {
	kernel.Kernel
	d time.Duration
}

func (s slowKernel) DestroySRQ(h kernel.SRQ) error {
	time.Sleep(s.d)
	return s.Kernel.DestroySRQ(h)
}

// The last release of one site's dialer endpoint closes it outside the
// process-wide xrcDialers lock: a Dial on an unrelated site (another fabric
// process here; another device in production) does not wait for it (it
// did, regardless of its own context).
func TestFabricDialerCloseBlocksNoOtherSite(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	f := newFabric(t)
	k, _ := kernel.Unwrap(f.Node("10.1.0.3").Process())
	slow := &memfabric.Process{}
	kernel.RegisterUnwrapper(func(v any) (kernel.Kernel, bool) {
		if v == any(slow) {
			return slowKernel{k, 2 * time.Second}, true
		}
		return nil, false
	})
	cfg, err := newConfig([]Option{WithDomainPath(filepath.Join(t.TempDir(), "s"))})
	require.NoError(t, err)
	cfg.fabric = slow
	_, release, err := acquireDialer(ctx, cfg, cfg.fabricSite(k.LocalAddr()))
	require.NoError(t, err)

	l := holdingListener(ctx, t, f.Node("10.1.0.1").Process())
	go release() // the last connection of site "slow" closes
	time.Sleep(50 * time.Millisecond)
	dctx, dcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer dcancel()
	took, err := timedDial(dctx, t, f, l.Addr().String())
	t.Logf("Dial with a 300ms deadline on another site: %v after %v", err, took)
	require.Less(t, took, time.Second, "an unrelated site's Dial waited for another site's endpoint Close")
}

// Churn on one site: Dials and Closes race, GlobalStats reads alongside.
func TestFabricSharedEndpointChurn(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	f := newFabric(t)
	srv, cli := f.Node("10.1.0.1").Process(), f.Node("10.1.0.2").Process()
	l, err := Listen(ctx, "10.1.0.1:0", WithFabric(srv), WithDomainPath(filepath.Join(t.TempDir(), "l")))
	require.NoError(t, err)
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept(ctx)
			if err != nil {
				return
			}
			go func() {
				buf := make([]byte, 64)
				for {
					n, err := c.Recv(ctx, buf)
					if err != nil {
						c.Close()
						return
					}
					c.Send(ctx, buf[:n])
				}
			}()
		}
	}()
	dom := filepath.Join(t.TempDir(), "d")
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
				GlobalStats()
			}
		}
	}()
	errs := make(chan error, 4)
	for g := 0; g < 4; g++ {
		go func() {
			for i := 0; i < 25; i++ {
				c, err := Dial(ctx, l.Addr().String(), WithFabric(cli), WithDomainPath(dom))
				if err != nil {
					errs <- err
					return
				}
				buf := make([]byte, 64)
				if err := c.Send(ctx, []byte("x")); err != nil {
					errs <- err
					return
				}
				if _, err := c.Recv(ctx, buf); err != nil {
					errs <- err
					return
				}
				c.Close()
			}
			errs <- nil
		}()
	}
	for range 4 {
		require.NoError(t, <-errs)
	}
	close(stop)
	xrcDialers.Lock()
	n := len(xrcDialers.m)
	xrcDialers.Unlock()
	require.Zero(t, n)
}

// removable reports a device removal once (the endpoint's receive loop
// sees ErrDeviceRemoved, as on a real device's DEVICE_REMOVAL), then works
// again: the device is back.
type removable struct {
	kernel.Kernel
	gone     chan struct{}
	reported atomic.Bool
}

// removableProcess wraps k in a removable and returns it with the process
// to pass to WithFabric for it.
func removableProcess(k kernel.Kernel) (*removable, *memfabric.Process) {
	rk := &removable{Kernel: k, gone: make(chan struct{})}
	fake := &memfabric.Process{}
	kernel.RegisterUnwrapper(func(v any) (kernel.Kernel, bool) {
		if v == any(fake) {
			return rk, true
		}
		return nil, false
	})
	return rk, fake
}

func (r *removable) PollRecv(ctx context.Context, h kernel.SRQ, out []kernel.RecvCompletion) (int, error) {
	pending := func() bool {
		select {
		case <-r.gone:
			return r.reported.CompareAndSwap(false, true)
		default:
			return false
		}
	}
	if pending() {
		return 0, kernel.ErrDeviceRemoved
	}
	if r.reported.Load() { // the device is back
		return r.Kernel.PollRecv(ctx, h, out)
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-r.gone:
			cancel()
		case <-cctx.Done():
		}
	}()
	n, err := r.Kernel.PollRecv(cctx, h, out)
	if err != nil && ctx.Err() == nil && pending() {
		return 0, kernel.ErrDeviceRemoved
	}
	return n, err
}

// After the endpoint of a site dies (device removed), a new Dial opens a
// fresh one, while Conns of the dead one are still open. The dead one used
// to stay the site's endpoint until every such Conn was Closed, failing
// every Dial although the device was back.
func TestFabricDeadSharedEndpointReplaced(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	f := newFabric(t)
	l := holdingListener(ctx, t, f.Node("10.1.0.1").Process())
	k, _ := kernel.Unwrap(f.Node("10.1.0.2").Process())
	rk, fake := removableProcess(k)
	cfg, err := newConfig([]Option{WithDomainPath(filepath.Join(t.TempDir(), "d"))})
	require.NoError(t, err)
	cfg.fabric = fake
	site := cfg.fabricSite(k.LocalAddr())
	c1, err := dialXRC(ctx, netip.MustParseAddrPort(l.Addr().String()), cfg, site)
	require.NoError(t, err)
	defer c1.Close() // after the checks: the broken Conn stays open for the second Dial
	close(rk.gone)   // the device goes, and comes back
	_, err = c1.Recv(ctx, make([]byte, 64))
	require.ErrorIs(t, err, ErrDeviceRemoved)
	// c1 is broken but not yet Closed by the application.
	c2, err := dialXRC(ctx, netip.MustParseAddrPort(l.Addr().String()), cfg, site)
	if err == nil {
		c2.Close()
	}
	t.Logf("Dial after the removal, with the broken Conn still open: %v", err)
	require.NoError(t, err, "a new Dial should get a fresh endpoint")
}

// An XRC listener's Accept after its device was removed fails with
// ErrDeviceRemoved, as an RC listener's does, and not ErrPeerGone: no
// connection was lost. It used to map the engine's error as a connection's,
// "accept ...: connection lost: RDMA device removed" (found by review).
func TestFabricAcceptAfterDeviceRemovalIsNotPeerGone(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	f := newFabric(t)
	k, _ := kernel.Unwrap(f.Node("10.1.0.1").Process())
	rk, fake := removableProcess(k)
	l, err := Listen(ctx, "10.1.0.1:7000", WithFabric(fake), WithDomainPath(filepath.Join(t.TempDir(), "l")))
	require.NoError(t, err)
	defer l.Close()
	close(rk.gone) // the endpoint's receive loop sees the removal
	var aerr error
	require.Eventually(t, func() bool {
		actx, acancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer acancel()
		_, aerr = l.Accept(actx)
		return aerr != nil && !errors.Is(aerr, context.DeadlineExceeded)
	}, 5*time.Second, 10*time.Millisecond, "Accept did not fail after the removal")
	require.ErrorIs(t, aerr, ErrDeviceRemoved)
	require.NotErrorIs(t, aerr, ErrPeerGone, "a listener's error is no lost connection")
	var oe *OpError
	require.ErrorAs(t, aerr, &oe)
	require.Equal(t, "accept", oe.Op)
}

// A device that fails for good (DEVICE_FATAL) under an XRC Conn and under
// an XRC listener: the Conn's Recv and the listener's Accept fail with
// ErrDeviceRemoved, as an RC Conn's do (async.go), rather than waiting for
// completions that a dead device never delivers.
func TestFabricXRCDeviceFatal(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	f := newFabric(t)
	l, err := Listen(ctx, "10.1.0.1:0", WithFabric(f.Node("10.1.0.1").Process()), WithXRC(XRCRequire),
		WithDomainPath(filepath.Join(t.TempDir(), "l")))
	require.NoError(t, err)
	defer l.Close()
	c, _ := dialAccepted(ctx, t, l, WithFabric(f.Node("10.1.0.2").Process()), WithXRC(XRCRequire),
		WithDomainPath(filepath.Join(t.TempDir(), "d")))
	recvErr := make(chan error, 1)
	go func() {
		_, err := c.Recv(ctx, make([]byte, 64))
		recvErr <- err
	}()
	f.Node("10.1.0.2").FailDevice()
	require.ErrorIs(t, <-recvErr, ErrDeviceRemoved)

	f.Node("10.1.0.1").FailDevice()
	_, err = l.Accept(ctx)
	require.ErrorIs(t, err, ErrDeviceRemoved)
}

// A refused XRC Dial wraps *xrc.RejectError with the reason.
func TestFabricDialRefusedError(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f := newFabric(t)
	f.Node("10.1.0.1").Process()
	start := time.Now()
	_, err := Dial(ctx, "10.1.0.1:7471", WithFabric(f.Node("10.1.0.2").Process()), WithDomainPath(filepath.Join(t.TempDir(), "d")))
	var re *xrc.RejectError
	require.ErrorAs(t, err, &re, "after %v", time.Since(start))
	require.Equal(t, xrc.RejectNoListener, re.Reason)
	require.ErrorIs(t, err, syscall.ECONNREFUSED, "a refused dial matches ECONNREFUSED, as TCP's and RC's do")
	// One operation, one address, no stutter (it read "dial: xrc: dial
	// 10.1.0.1:7471: xrc: 10.1.0.1:7471 refused the connection: ...").
	require.IsType(t, (*OpError)(nil), err)
	require.Equal(t, "dial 10.1.0.1:7471: connection refused: NO_LISTENER (detail 0, CM status 8: invalid service id (no listener))", err.Error())
}

// holdingListener listens on p's node and holds every connection it
// accepts until ctx ends.
func holdingListener(ctx context.Context, t *testing.T, p *memfabric.Process) *Listener {
	t.Helper()
	l, err := Listen(ctx, p.Node().Addr().String()+":0", WithFabric(p), WithDomainPath(filepath.Join(t.TempDir(), "l")))
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept(ctx)
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	return l
}

// A peer whose ACCEPT does not answer the request broke the handshake: the
// Dial fails with ErrProtocol (it failed with an untyped error) and keeps
// nothing of the attempt.
func TestFabricDialBadAcceptIsProtocolError(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f := newFabric(t)
	k, ok := kernel.Unwrap(f.Node("10.1.0.1").Process())
	require.True(t, ok)
	defer k.Close()
	addr := netip.AddrPortFrom(k.LocalAddr(), 7471)
	var answered atomic.Int32
	for _, ex := range []kernel.Exchange{kernel.ExchangeXRC, kernel.ExchangeSIDR} {
		l, err := k.Listen(addr, ex)
		require.NoError(t, err)
		go func() {
			for {
				ev, err := k.Event(context.Background(), l)
				if err != nil {
					return
				}
				if ev.Type == kernel.EventConnectRequest {
					answered.Add(1)
					k.Accept(ev.ID, 77, []byte("not an ACCEPT"))
				}
			}
		}()
	}
	cli := f.Node("10.1.0.2").Process()
	_, err := Dial(ctx, addr.String(), WithFabric(cli), WithDomainPath(filepath.Join(t.TempDir(), "d")))
	require.ErrorIs(t, err, ErrProtocol)
	require.NotZero(t, answered.Load())
	var oe *OpError
	require.ErrorAs(t, err, &oe)
	require.Equal(t, "dial", oe.Op)
	require.Eventually(t, func() bool { return cli.Handles() == 0 }, 5*time.Second, 10*time.Millisecond,
		"the dialing process holds %d kernel handles", cli.Handles())
}

// stuckOpen blocks opening an XRC domain until open is closed, as a slow
// device open sits in the kernel, deaf to contexts.
type stuckOpen struct {
	kernel.Kernel
	entered, open chan struct{}
	once          *sync.Once
}

func (s stuckOpen) OpenXRCD(path string, flags kernel.XRCDFlags) (kernel.XRCD, error) {
	s.once.Do(func() { close(s.entered) })
	<-s.open
	return s.Kernel.OpenXRCD(path, flags)
}

// A shared dialer endpoint opens outside the process-wide lock: while one
// site's endpoint is slow to open, a Dial on another site goes on, and a
// second Dial on the slow site gives up with its own context (both waited
// for the open, regardless of their contexts).
func TestFabricDialerOpenBlocksNoOne(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	f := newFabric(t)
	k, _ := kernel.Unwrap(f.Node("10.1.0.3").Process())
	stuck := stuckOpen{k, make(chan struct{}), make(chan struct{}), new(sync.Once)}
	var opened sync.Once
	unstick := func() { opened.Do(func() { close(stuck.open) }) }
	t.Cleanup(unstick) // on failure, lets the first acquire (and the old code's lock) go
	slow := &memfabric.Process{}
	kernel.RegisterUnwrapper(func(v any) (kernel.Kernel, bool) {
		if v == any(slow) {
			return stuck, true
		}
		return nil, false
	})
	cfg, err := newConfig([]Option{WithDomainPath(filepath.Join(t.TempDir(), "s"))})
	require.NoError(t, err)
	cfg.fabric = slow
	site := cfg.fabricSite(k.LocalAddr())
	type acquired struct {
		ep      *xrc.Endpoint
		release func()
		err     error
	}
	first := make(chan acquired, 1)
	go func() {
		ep, release, err := acquireDialer(ctx, cfg, site)
		first <- acquired{ep, release, err}
	}()
	<-stuck.entered

	// Each call runs on its own goroutine: on the old code they waited on
	// the lock for ever.
	within := func(what string, f func() error) error {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- f() }()
		select {
		case err := <-done:
			return err
		case <-time.After(3 * time.Second):
			t.Fatalf("%s: still waiting for the other open after 3s", what)
			return nil
		}
	}
	l := holdingListener(ctx, t, f.Node("10.1.0.1").Process())
	err = within("a Dial on another site", func() error {
		c, err := Dial(ctx, l.Addr().String(), WithFabric(f.Node("10.1.0.2").Process()), WithDomainPath(filepath.Join(t.TempDir(), "d")))
		if err == nil {
			c.Close()
		}
		return err
	})
	require.NoError(t, err)
	err = within("a second acquire on the opening site, with a 100ms deadline", func() error {
		wctx, wcancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer wcancel()
		_, _, err := acquireDialer(wctx, cfg, site)
		return err
	})
	require.ErrorIs(t, err, context.DeadlineExceeded)

	unstick()
	a := <-first
	require.NoError(t, a.err)
	ep, release, err := acquireDialer(ctx, cfg, site)
	require.NoError(t, err)
	require.Same(t, a.ep, ep, "one endpoint per site and options")
	release()
	a.release()
	xrcDialers.Lock()
	defer xrcDialers.Unlock()
	require.Nil(t, xrcDialers.m[dialerKey(t, cfg, site)], "the last release closes the endpoint")
}

// Over XRC the two sides' limits need not agree: each side sends what the
// other's endpoint receives, and a Recv buffer of MaxRecvSize takes what
// the peer may send. A listener of 4 KiB and a Dial of the default size:
// the dialer sends 4 KiB and receives 64 KiB, the listener's connection the
// other way round, bounded by its own size.
func TestFabricRecvBufferOfMaxRecvSizeFits(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dir := t.TempDir()
	f := newFabric(t)
	l, err := Listen(ctx, "10.1.0.1:7000", WithFabric(f.Node("10.1.0.1").Process()), WithDomainPath(filepath.Join(dir, "s")), WithMessageSize(4096))
	require.NoError(t, err)
	defer l.Close()
	c, err := Dial(ctx, "10.1.0.1:7000", WithFabric(f.Node("10.1.0.2").Process()), WithDomainPath(filepath.Join(dir, "c")))
	require.NoError(t, err)
	defer c.Close()
	s, err := l.Accept(ctx)
	require.NoError(t, err)
	defer s.Close()
	require.Equal(t, 4096, c.MaxMessageSize(), "what the listener's endpoint receives")
	require.Equal(t, DefaultMessageSize, c.MaxRecvSize())
	require.Equal(t, 4096, s.MaxMessageSize())
	require.Equal(t, 4096, s.MaxRecvSize())
	require.ErrorIs(t, c.Send(ctx, make([]byte, 4097)), ErrMessageTooLong)

	require.NoError(t, c.Send(ctx, make([]byte, c.MaxMessageSize())))
	n, err := s.Recv(ctx, make([]byte, s.MaxRecvSize()))
	require.NoError(t, err)
	require.Equal(t, c.MaxMessageSize(), n)
	require.NoError(t, s.Send(ctx, make([]byte, s.MaxMessageSize())))
	n, err = c.Recv(ctx, make([]byte, c.MaxRecvSize()))
	require.NoError(t, err)
	require.Equal(t, s.MaxMessageSize(), n)
}

// The net.Conn conformance suite over XRC connections on the in-memory
// fabric (TestNetConnConformance runs it on RC's fake transport).
func TestFabricNetConnConformance(t *testing.T) {
	nettest.TestConn(t, func() (net.Conn, net.Conn, func(), error) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		f := newFabric(t)
		l, err := Listen(ctx, "10.9.0.1:0", WithFabric(f.Node("10.9.0.1").Process()), WithDomainPath(filepath.Join(t.TempDir(), "s")))
		if err != nil {
			return nil, nil, nil, err
		}
		accepted := make(chan *Conn, 1)
		go func() {
			s, _ := l.Accept(ctx)
			accepted <- s
		}()
		c, err := Dial(ctx, l.Addr().String(), WithFabric(f.Node("10.9.0.2").Process()), WithDomainPath(filepath.Join(t.TempDir(), "c")))
		if err != nil {
			l.Close()
			return nil, nil, nil, err
		}
		s := <-accepted
		if s == nil {
			c.Close()
			l.Close()
			return nil, nil, nil, errors.New("accept failed")
		}
		return c.NetConn(), s.NetConn(), func() { c.Close(); s.Close(); l.Close() }, nil
	})
}

// A *memfabric.Process that is not a node's (a zero value) is refused by
// Listen with xrc.ErrNoKernel; Dial must refuse it too, not panic on its
// nil Node, and its Handles is 0 (it holds nothing).
func TestFabricZeroProcessRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	p := &memfabric.Process{}
	dom := WithDomainPath(filepath.Join(t.TempDir(), "x"))
	_, err := Listen(ctx, "10.1.0.1:7000", WithFabric(p), dom)
	require.ErrorIs(t, err, xrc.ErrNoKernel)
	require.NotPanics(t, func() {
		_, err = Dial(ctx, "10.1.0.1:7000", WithFabric(p), dom)
	})
	require.ErrorIs(t, err, xrc.ErrNoKernel)
	require.NotPanics(t, func() { require.Zero(t, p.Handles()) })
}

// One-sided RDMA over XRC is ErrNotSupported (package doc), whatever the
// arguments: a nil local region was reported as a plain argument error
// first, which errors.Is(err, ErrNotSupported) does not match.
func TestFabricOneSidedNilRegionIsNotSupported(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f := newFabric(t)
	srv, cli := f.Node("10.1.0.1").Process(), f.Node("10.1.0.2").Process()
	c, _ := fabricPair(ctx, t, srv, cli, nil, nil)
	require.ErrorIs(t, c.WriteRemote(ctx, nil, 0, 8, RemoteRegion{Len: 64}, 0), ErrNotSupported)
	require.ErrorIs(t, c.ReadRemote(ctx, nil, 0, 8, RemoteRegion{Len: 64}, 0), ErrNotSupported)
}

// timedDial dials addr from node 10.1.0.2 of f, closes what it got, and
// says how long the Dial took.
func timedDial(ctx context.Context, t *testing.T, f *memfabric.Fabric, addr string) (time.Duration, error) {
	start := time.Now()
	c, err := Dial(ctx, addr, WithFabric(f.Node("10.1.0.2").Process()), WithDomainPath(filepath.Join(t.TempDir(), "d")))
	took := time.Since(start)
	if err == nil {
		c.Close()
	}
	return took, err
}
