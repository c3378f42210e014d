package cm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"sync"

	"github.com/goxrc/goxrc/rdmacm"
	"github.com/goxrc/goxrc/xrc"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// WithFabric runs connections on a process of an in-memory RDMA fabric
// (package xrc/memfabric) instead of a device. The fabric has XRC, so the
// connections are XRC: processes of a node share the node's XRC domain
// (WithDomainPath names its directory), an endpoint (a listener's, or the
// one a process's Dials share) reaches every process of a remote node over
// one INI QP, and a node keeps one TGT QP per remote sending endpoint (see
// Transports in the package documentation). Use it to test code built on
// this package without RDMA hardware: it needs no device, no root and no
// cgo. Pass the same fabric's processes to Listen and Dial
// (memfabric.New().Node(ip).Process()). A node has one
// address, of one family: Listen on an unspecified address of either family
// (":port", "[::]:port") listens on it, and Addr says which. WithDomainPath
// is optional; tests set it to keep runs apart. Over the fabric, the
// engine's limits and timers apply: WithMessageSize is clamped to 64 bytes
// to 1 MiB, WithQueueDepth bounds the messages a connection holds, and
// WithKeepalive, WithDevice, WithBusyPoll, WithInlineThreshold and
// WithBacklog have no effect (the engine has its heartbeat and idle
// timeout, see xrc.Config). WithXRC(XRCOff) contradicts it and fails with
// ErrInvalid, and WithRawMessages with ErrNotSupported. A process that dies
// (memfabric's Kill, or its node's PowerOff) closed nothing of the
// application's: its connections fail with ErrPeerGone wrapping
// xrc.ErrProcessDied, and Dial and Listen on it with xrc.ErrProcessDied;
// its listeners' Accept says ErrClosed with that cause in words, as an RC
// listener that failed does.
func WithFabric(p *memfabric.Process) Option { return func(c *config) { c.fabric = p } }

// xrcSite is where an XRC endpoint runs: a process of an in-memory fabric,
// or a real device (one with XRC) and its address.
type xrcSite struct {
	fabric *memfabric.Process
	device string
	local  netip.Addr
}

// fabricSite is the site of a WithFabric listener or dialer at local.
func (cfg *config) fabricSite(local netip.Addr) xrcSite {
	return xrcSite{fabric: cfg.fabric, local: local}
}

// deviceSite is the site of a connection whose CM id is bound (or resolved)
// to a device with XRC.
func (cfg *config) deviceSite(id *rdmacm.ID) xrcSite {
	if p := testKernel(id); p != nil {
		return xrcSite{fabric: p, local: id.LocalAddr().Addr()}
	}
	return xrcSite{device: id.DeviceName(), local: id.LocalAddr().Addr()}
}

// xrcConfig builds the engine's configuration for a listener or a dialer on
// site, listening on port.
func (cfg *config) xrcConfig(site xrcSite, port uint16) (xrc.Config, error) {
	if cfg.raw { // WithRawMessages and WithXRC(XRCRequire) on a device; newConfig refuses it with WithFabric
		return xrc.Config{}, fmt.Errorf("raw messages over XRC: %w", ErrNotSupported)
	}
	return xrc.Config{
		Process:          site.fabric,
		Device:           site.device,
		Addr:             netip.AddrPortFrom(site.local, port).String(),
		DomainDir:        cfg.domainPath,
		HandshakeTimeout: cfg.handshakeTimeout,
		RecvWindow:       cfg.queueDepth,
		// The endpoint's receive slots: what its peers may send. XRC's
		// range is narrower than cm's.
		MaxMessageSize: min(max(cfg.messageSize, xrc.MinMessageSize), xrc.MaxMessageSize),
		Heartbeat:      cfg.xrcHeartbeat,
		IdleTimeout:    cfg.xrcIdle,
	}, nil
}

// newXRCConn wraps a logical XRC connection in a Conn.
func newXRCConn(x *xrc.Conn, cfg config, release func()) *Conn {
	globalStats.connsOpen.Add(1)
	globalStats.connsTotal.Add(1)
	return &Conn{
		x: x, xrelease: release, laddr: Addr{x.LocalAddr()}, raddr: Addr{x.RemoteAddr()},
		// What the endpoint receives, which may be more than this Dial
		// asked for (the engine's floor is xrc.MinMessageSize).
		maxSend: min(cfg.messageSize, x.MaxMessageSize()), maxRecv: x.MaxRecvSize(),
	}
}

// The endpoints of XRC dialers, by their configuration: the Dials of this
// process on one fabric process, or on one device and local address, with
// the same WithDomainPath, WithHandshakeTimeout, WithQueueDepth and
// WithMessageSize share one endpoint, and so one uplink per remote node.
// Dials that differ in one of them get an endpoint of their own: the
// options are what the endpoint receives, and a Dial sharing another's
// endpoint would receive by the other's sizes. The endpoint closes with the
// last connection that uses it.
var xrcDialers struct {
	sync.Mutex
	m map[xrc.Config]*xrcDialer
}

type xrcDialer struct {
	refs   int           // under xrcDialers
	opened chan struct{} // closed once ep or err is set
	ep     *xrc.Endpoint
	err    error
}

var xrcEndpoints sync.Map // *xrc.Endpoint -> its Config.Process (nil on a device): for GlobalStats

func newEndpoint(ctx context.Context, xc xrc.Config) (*xrc.Endpoint, error) {
	ep, err := xrc.NewEndpoint(ctx, xc)
	if err != nil {
		return nil, err
	}
	xrcEndpoints.Store(ep, xc.Process)
	return ep, nil
}

// xrcClosed holds the closed endpoints' counters, so that the process's
// sums never go back; its lock puts an endpoint's move into them wholly
// before or after an xrcStats, which counts it once.
var xrcClosed struct {
	sync.Mutex
	recoveries, rejected uint64
}

// closeEndpoint closes ep, counted in GlobalStats until its Close has
// destroyed what it holds, as its own Stats counts it.
func closeEndpoint(ep *xrc.Endpoint) error {
	err := ep.Close()
	es := ep.Stats() // final: nothing of ep runs any more
	xrcClosed.Lock()
	xrcEndpoints.Delete(ep)
	xrcClosed.recoveries += es.Recoveries
	xrcClosed.rejected += es.Rejected
	xrcClosed.Unlock()
	return err
}

// acquireDialer returns the dialer endpoint of site for cfg, opening it on
// first use, and the function that drops the reference taken. Every Dial
// checks its options (xrcConfig), also one that joins an open endpoint. An
// endpoint that died (its device went away) is left to the connections
// that hold it, and a new one opens. The endpoint opens outside the
// process-wide lock: Dials for other endpoints go on meanwhile, and Dials for
// this one wait for it with their own contexts.
func acquireDialer(ctx context.Context, cfg config, site xrcSite) (*xrc.Endpoint, func(), error) {
	xc, err := cfg.xrcConfig(site, 0)
	if err != nil {
		return nil, nil, err
	}
	xc.DialOnly = true
	for {
		xrcDialers.Lock()
		if xrcDialers.m == nil {
			xrcDialers.m = map[xrc.Config]*xrcDialer{}
		}
		d := xrcDialers.m[xc]
		if d != nil && d.isOpen() && d.ep.Err() != nil {
			delete(xrcDialers.m, xc)
			d = nil
		}
		opener := d == nil
		if opener {
			d = &xrcDialer{opened: make(chan struct{})}
			xrcDialers.m[xc] = d
		}
		d.refs++
		xrcDialers.Unlock()
		release := d.releaser(xc)
		if opener {
			ep, err := newEndpoint(ctx, xc)
			xrcDialers.Lock()
			d.ep, d.err = ep, err
			if err != nil && xrcDialers.m[xc] == d {
				delete(xrcDialers.m, xc)
			}
			close(d.opened)
			xrcDialers.Unlock()
			if err != nil {
				release()
				return nil, nil, err
			}
			return ep, release, nil
		}
		select {
		case <-d.opened:
		case <-ctx.Done():
			release()
			return nil, nil, ctx.Err()
		}
		if d.err == nil {
			return d.ep, release, nil
		}
		// The opener failed, perhaps on its own context: try again, this
		// Dial opening with its own.
		release()
	}
}

func (d *xrcDialer) isOpen() bool {
	select {
	case <-d.opened:
		return d.err == nil
	default:
		return false
	}
}

// releaser returns the function that drops one reference to d, the
// dialer of key, closing its endpoint with the last.
func (d *xrcDialer) releaser(key xrc.Config) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			xrcDialers.Lock()
			d.refs--
			last := d.refs == 0
			if last && xrcDialers.m[key] == d {
				delete(xrcDialers.m, key)
			}
			xrcDialers.Unlock()
			if last && d.isOpen() {
				// Outside the lock: Close waits up to a second for FINs,
				// and other Dials of the process must not wait with it.
				closeEndpoint(d.ep)
			}
		})
	}
}

// dialXRC dials dst through the dialer endpoint of site.
func dialXRC(ctx context.Context, dst netip.AddrPort, cfg config, site xrcSite) (*Conn, error) {
	fail := func(err error) (*Conn, error) { return nil, opError("dial", Addr{dst}, err) }
	ep, release, err := acquireDialer(ctx, cfg, site)
	if err != nil {
		return fail(mapXRCSetupErr(err))
	}
	x, err := ep.Dial(ctx, dst.String())
	if err != nil {
		release()
		return fail(mapXRCSetupErr(err))
	}
	return newXRCConn(x, cfg, release), nil
}

// listenXRC listens on local with a new endpoint on site, or a closed
// listener's, taken over (openXRCListen).
func listenXRC(ctx context.Context, local netip.AddrPort, cfg config, site xrcSite) (*Listener, error) {
	xc, err := cfg.xrcConfig(site, local.Port())
	if err != nil {
		return nil, opError("listen", Addr{local}, err)
	}
	xl, term, err := openXRCListen(ctx, xc, site, local.Port(), true)
	if err != nil {
		return nil, opError("listen", Addr{local}, engineErr(err))
	}
	globalStats.listeners.Add(1)
	return &Listener{cfg: cfg, xep: xl.ep, xl: xl, term: term, addr: Addr{xl.ep.Addr()}, done: make(chan struct{})}, nil
}

// xrcStats sums the XRC endpoints of the process (Recoveries and Rejected
// the closed ones' too). Kernel handles are a
// kernel's, which endpoints on one fabric process share: each such kernel
// counts once.
func xrcStats() (s xrc.Stats) {
	counted := map[any]bool{}
	xrcClosed.Lock()
	defer xrcClosed.Unlock()
	s.Recoveries, s.Rejected = xrcClosed.recoveries, xrcClosed.rejected
	xrcEndpoints.Range(func(k, p any) bool {
		ep := k.(*xrc.Endpoint)
		es := ep.Stats()
		s.Recoveries += es.Recoveries
		s.Rejected += es.Rejected
		s.Uplinks += es.Uplinks
		s.Downlinks += es.Downlinks
		s.LocalCounts += es.LocalCounts
		s.QPs += es.QPs
		s.Conns += es.Conns
		kern := p
		if p.(*memfabric.Process) == nil {
			kern = ep // on a device, each endpoint opens its own
		}
		if !counted[kern] && es.KernelHandles >= 0 {
			counted[kern] = true
			s.KernelHandles += es.KernelHandles
		}
		return true
	})
	return s
}

func (c *Conn) sendXRC(ctx context.Context, p []byte, hasImm bool) error {
	if hasImm {
		// The engine carries its receiver tags in the immediate data.
		return c.opErr("send", fmt.Errorf("immediate data over XRC: %w", ErrNotSupported))
	}
	if err := c.x.Send(ctx, p); err != nil {
		return c.opErr("send", mapXRCErr(c.closedXRCErr(err)))
	}
	c.stats.msgsSent.Add(1)
	c.stats.bytesSent.Add(uint64(len(p)))
	return nil
}

func (c *Conn) recvXRC(ctx context.Context, buf []byte) (int, uint32, bool, error) {
	n, err := c.x.Recv(ctx, buf)
	if err != nil {
		if errors.Is(err, io.EOF) {
			return 0, 0, false, io.EOF
		}
		return 0, 0, false, c.opErr("recv", mapXRCErr(c.closedXRCErr(err)))
	}
	c.mu.Lock()
	c.stats.msgsRecv++
	c.stats.bytesRecv += uint64(n)
	c.mu.Unlock()
	return n, 0, false, nil
}

func (c *Conn) closeWriteXRC() error {
	if c.wroteEnd.Load() && !c.xclosed.Load() {
		return nil // as over RC (wroteEnd); the engine says the peer's end
	}
	if err := c.x.CloseWrite(); err != nil {
		if c.xclosed.Load() {
			// After our Close, ErrClosed or the failure that broke the
			// connection before, as Send and Recv answer (the engine
			// answers with its error first, a peer's death after its
			// FIN too, which broke nothing).
			err = c.closedXRCErr(xrc.ErrClosed)
		}
		return c.opErr("close write", mapXRCErr(err))
	}
	c.wroteEnd.Store(true)
	return nil
}

// closedXRCErr is err, a call's, but after our Close the failure that broke
// the connection before, if one did (the engine says ErrClosed first), as
// an RC connection answers.
func (c *Conn) closedXRCErr(err error) error {
	if c.xclosed.Load() && errors.Is(err, xrc.ErrClosed) {
		if f := c.x.Err(); xrcFailed(f) {
			return f
		}
	}
	return err
}

func (c *Conn) closeXRC() error {
	c.xclosed.Store(true)
	c.releaseOnce.Do(func() {
		if err := c.x.Close(); err != nil {
			c.releaseErr = c.opErr("close", mapXRCErr(err))
		}
		c.xrelease()
		globalStats.connsOpen.Add(-1)
	})
	return c.releaseErr
}

// xrcFailed reports whether the engine's verdict on the connection, err
// (xrc.Conn.Err), is a failure that Stats.Errors counts, as an RC
// connection's: not the caller's own ends (Close, a context, a short
// buffer), nor the peer's orderly one.
func xrcFailed(err error) bool {
	switch {
	case err == nil, errors.Is(err, xrc.ErrClosed), errors.Is(err, xrc.ErrPeerClosed), errors.Is(err, xrc.ErrMessageTooLong),
		errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return false
	}
	return true
}

// engineErr takes the engine's *xrc.OpError off err: the caller's *OpError
// names the operation and address.
func engineErr(err error) error {
	if oe, ok := err.(*xrc.OpError); ok {
		return oe.Err
	}
	return err
}

// mapXRCSetupErr gives the engine's errors of a Dial and of a listener's
// Accept the meaning of this package's. A removed device ends the Dial or
// the listener, not a connection (none was made or lost): its error is
// ErrDeviceRemoved without ErrPeerGone, as an RC Dial's (dialAddr) and an
// RC listener's (closedErr). So does the death of the endpoint's process
// (xrc.ErrProcessDied), which a connection's error wraps ErrPeerGone for
// as well: it is lost, not closed by the application.
func mapXRCSetupErr(err error) error {
	if err = engineErr(err); errors.Is(err, xrc.ErrDeviceRemoved) || errors.Is(err, xrc.ErrProcessDied) {
		return err
	}
	return mapXRCErr(err)
}

// mapXRCErr gives the engine's errors of a connection the meaning of this
// package's (engineErr too).
func mapXRCErr(err error) error {
	err = engineErr(err)
	switch {
	case errors.Is(err, xrc.ErrDeviceRemoved), errors.Is(err, xrc.ErrProcessDied):
		return fmt.Errorf("%w: %w", ErrPeerGone, err)
	case errors.Is(err, xrc.ErrPeerGone):
		return &xrcMapped{ErrPeerGone, xrc.ErrPeerGone, err}
	case errors.Is(err, xrc.ErrPeerClosed):
		return fmt.Errorf("%w: %w", ErrPeerGone, err)
	case errors.Is(err, xrc.ErrClosed):
		return ErrClosed
	case errors.Is(err, xrc.ErrProtocol):
		return &xrcMapped{ErrProtocol, xrc.ErrProtocol, err}
	case errors.Is(err, xrc.ErrMessageTooLong):
		return &xrcMapped{ErrMessageTooLong, xrc.ErrMessageTooLong, err}
	}
	return err
}

// xrcMapped is an engine error given this package's meaning (mine, the
// sentinel of this package that means what the engine's, theirs, does). It
// matches both, and says the meaning once: "message too long: 11-byte
// message, 2-byte buffer", as an RC connection's error does, not "message
// too long: xrc: message too long: ...".
type xrcMapped struct{ mine, theirs, err error }

func (e *xrcMapped) Error() string {
	s := e.err.Error()
	if rest, ok := strings.CutPrefix(s, e.theirs.Error()); ok {
		return e.mine.Error() + rest
	}
	return e.mine.Error() + ": " + s
}

func (e *xrcMapped) Unwrap() []error { return []error{e.mine, e.err} }
