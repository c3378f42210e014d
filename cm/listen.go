package cm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/internal/rdmaaddr"
	"github.com/goxrc/goxrc/rdmacm"
	"github.com/goxrc/goxrc/verbs"
	"github.com/goxrc/goxrc/xrc"
)

// Listener accepts RDMA connections on an ip:port. It follows net.Listener
// where that fits: Addr, and a Close that wakes pending Accepts. Listen makes
// Listeners; a nil or zero Listener is a closed one.
type Listener struct {
	cfg config
	ch  *chanRef
	id  *rdmacm.ID
	dev *device // the device cache, held while listening (nil for a wildcard address)
	// A wildcard listener holds the devices of the connections it
	// accepted instead (wildcard.go).
	heldMu     sync.Mutex
	held       map[*device]*rdmacm.ID
	heldClosed bool
	heldWG     sync.WaitGroup
	xep        *xrc.Endpoint  // XRC: instead of ch and id (WithFabric, XRCRequire), or beside them (XRCPrefer), on a device with XRC
	xl         *xrcListen     // xep's references (xrclisten.go)
	term       xrc.AcceptTerm // the listener's accepting term on xep
	addr       Addr

	ready chan *Conn // handshakes that completed, waiting for Accept
	// inProgress holds a token for each handshake under way and each
	// connection waiting in ready: at most the backlog, so that requests
	// (each a QP and its registered buffers before the dialer has proved
	// anything) cannot pile up without bound.
	inProgress chan struct{}
	done       chan struct{} // closed by Close
	ctx        context.Context
	stop       context.CancelFunc // ends ctx, which bounds handshakes, at Close
	closeOnce  sync.Once
	wg         sync.WaitGroup        // the event loop and handshakes in flight
	removed    atomic.Bool           // the device went away: Accept says so
	failed     atomic.Pointer[error] // the event channel broke: Accept says so
}

// Listen listens for connections on address ("ip:port"; port 0 picks one;
// a host name listens on its first address; ":port" on IPv4's unspecified
// address, "[::]:port" on IPv6's; with WithFabric, either on the node's
// one address).
// The listener serves the device the address belongs to (any device for an
// unspecified address, each held from the first connection accepted there
// until Close: see the package documentation, "Resources per device"). In
// an XRC mode (WithXRC) on a device with XRC, it listens with an XRC
// endpoint of its own (package xrc), or takes over that of a closed XRC
// listener on the address whose connections still hold the port (see
// Close). With XRCRequire only XRC dialers reach it; with XRCPrefer it also
// listens for RC on the same port, so that XRCOff dialers and those on
// devices without XRC reach it too, and Accept returns both kinds. ctx
// bounds setting up the listener only: the listener outlives it.
//
// Over RC, like `rping -s -a ADDR -p PORT -P`: the same port space
// (RDMA_PS_TCP), not the same protocol.
func Listen(ctx context.Context, address string, opts ...Option) (*Listener, error) {
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, &OpError{Op: "listen", Addr: address, Err: err}
	}
	local, err := resolveAddr(ctx, cfg.resolver, address)
	if err != nil {
		return nil, &OpError{Op: "listen", Addr: address, Err: err}
	}
	if cfg.fabric != nil {
		if k, ok := kernel.Unwrap(cfg.fabric); ok && (local.Addr().IsUnspecified() || local.Addr().WithZone("") == k.LocalAddr().WithZone("")) {
			// The endpoint binds the node's address: key the listener
			// (and a later take-over) by it, however it was spelled
			// (unspecified, or with a zone: the fabric is one link).
			local = netip.AddrPortFrom(k.LocalAddr(), local.Port())
		}
		return listenXRC(ctx, local, cfg, cfg.fabricSite(local.Addr()))
	}
	if cfg.device != "" && local.Addr().IsUnspecified() {
		// Listen on the forced device only.
		ip, err := rdmaaddr.AddrOf(cfg.device, local.Addr())
		if err != nil {
			return nil, opError("listen", Addr{local}, err)
		}
		local = netip.AddrPortFrom(ip, local.Port())
	}
	fail := func(err error) (*Listener, error) { return nil, opError("listen", Addr{local}, err) }
	ch, err := newChanRef()
	if err != nil {
		return fail(err)
	}
	id, err := ch.ch.CreateID(rdmacm.PortSpaceTCP, verbs.QPTypeRC)
	if err != nil {
		ch.release()
		return fail(err)
	}
	useXRC := false
	err = id.Bind(local)
	switch {
	case err != nil:
	case local.Addr().IsUnspecified():
		err = cfg.checkXRCUnbound()
	default:
		err = cfg.checkDevice(id)
		if err == nil {
			useXRC, err = cfg.checkXRC(id)
		}
	}
	if err == nil && useXRC && cfg.xrc == XRCRequire {
		// A device with XRC: the bind told us which; an XRC endpoint of
		// the listener's own listens there instead.
		site := cfg.deviceSite(id)
		id.Close()
		ch.release()
		return listenXRC(ctx, local, cfg, site)
	}
	var xl *xrcListen
	var term xrc.AcceptTerm
	if err == nil && useXRC {
		// XRCPrefer on a device with XRC: an XRC endpoint listens on
		// the id's port number, and the id goes on listening for RC
		// dialers (their requests are in RDMA_PS_TCP, the endpoint's in
		// RDMA_PS_IB and RDMA_PS_UDP).
		id, xl, term, err = openXRCBeside(ctx, local, cfg, ch, id)
	}
	if err == nil {
		err = id.Listen(max(cfg.backlog, 1))
	}
	abandon := func(err error) (*Listener, error) {
		if xl != nil {
			xl.stopListening()
		}
		if id != nil {
			id.Close()
		}
		ch.release()
		return fail(err)
	}
	if err != nil {
		return abandon(err)
	}
	l := &Listener{
		cfg: cfg, ch: ch, id: id, addr: Addr{id.LocalAddr()},
		ready: make(chan *Conn, cfg.backlog), done: make(chan struct{}),
		inProgress: make(chan struct{}, max(cfg.backlog, 1)),
		xl:         xl, term: term,
	}
	if xl != nil {
		l.xep = xl.ep
	}
	if !local.Addr().IsUnspecified() {
		// Hold the device's cache (context, PD, buffers, QPs of closed
		// connections) between connections: a server whose connections
		// come and go would otherwise rebuild it for each burst.
		if l.dev, err = acquireDevice(id); err != nil {
			return abandon(err)
		}
		devices.Lock()
		l.dev.listeners++ // with acquireDevice's reference: dropListener gives both back
		devices.Unlock()
	}
	l.ctx, l.stop = context.WithCancel(context.Background())
	globalStats.listeners.Add(1)
	l.wg.Add(1)
	go l.loop()
	if l.dev != nil {
		go l.watchFatal()
	}
	if l.xep != nil {
		l.wg.Add(1)
		go l.feedXRC()
	}
	return l, nil
}

// openXRCBeside opens the XRC endpoint of an XRCPrefer listener on the port
// number of id, bound to local. Where local's port is 0 and the endpoint
// finds that number taken, it binds a new id (to another number) in place
// of id and tries again. It returns the id it bound (nil where making a new
// one failed), which the caller closes if it fails.
func openXRCBeside(ctx context.Context, local netip.AddrPort, cfg config, ch *chanRef, id *rdmacm.ID) (*rdmacm.ID, *xrcListen, xrc.AcceptTerm, error) {
	site := cfg.deviceSite(id)
	for try := 0; ; try++ {
		port := id.LocalAddr().Port()
		xc, err := cfg.xrcConfig(site, port)
		if err != nil {
			return id, nil, xrc.AcceptTerm{}, err
		}
		xl, term, err := openXRCListen(ctx, xc, site, port, local.Port() != 0)
		if err == nil {
			return id, xl, term, nil
		}
		// As the engine's own bind (xrc.Endpoint's listen), EADDRNOTAVAIL
		// too: the kernel's answer where a holder is bound to a wildcard.
		taken := errors.Is(err, syscall.EADDRINUSE) || errors.Is(err, syscall.EADDRNOTAVAIL)
		if local.Port() != 0 || !taken || try >= 50 {
			return id, nil, xrc.AcceptTerm{}, fmt.Errorf("XRC beside RC on port %d: %w", port, engineErr(err))
		}
		id.Close()
		if id, err = ch.ch.CreateID(rdmacm.PortSpaceTCP, verbs.QPTypeRC); err != nil {
			return nil, nil, xrc.AcceptTerm{}, err
		}
		if err := id.Bind(local); err != nil {
			return id, nil, xrc.AcceptTerm{}, err
		}
	}
}

// feedXRC hands an XRCPrefer listener's XRC connections to Accept beside its
// RC ones, as handshakes that completed.
func (l *Listener) feedXRC() {
	defer l.wg.Done()
	for l.xl.acquire() {
		x, err := l.xep.AcceptIn(l.ctx, l.term)
		if err != nil {
			l.xl.release()
			if l.ctx.Err() == nil {
				// The endpoint failed (its device went, say): RC
				// dialers may still come.
				l.cfg.logger.Warn("listener's XRC endpoint failed; RC goes on", "addr", l.addr, "err", err)
			}
			return
		}
		// closeXRC calls the release once (releaseOnce).
		c := newXRCConn(x, l.cfg, func() { l.xl.release() })
		select {
		case l.inProgress <- struct{}{}:
		case <-l.done:
			c.Close()
			return
		}
		select {
		case l.ready <- c:
		case <-l.done:
			<-l.inProgress
			c.Close()
			return
		}
	}
}

// Addr returns the address the listener is bound to, with the port the
// system chose for port 0.
func (l *Listener) Addr() net.Addr {
	if !l.ok() {
		return nil
	}
	return l.addr
}

// Accept waits for the next connection whose handshake has completed.
func (l *Listener) Accept(ctx context.Context) (*Conn, error) {
	if !l.ok() {
		return nil, ErrClosed // as the calls on a nil Conn
	}
	if l.xrcOnly() {
		select {
		case <-l.done:
			// The endpoint may accept for a Listen that took it over.
			return nil, opError("accept", l.addr, ErrClosed)
		default:
		}
		// The reference for the connection is taken first: a Close while
		// Accept returns must not close the endpoint under it. Accepting
		// in the listener's own term, it takes nothing meant for a Listen
		// that took the endpoint over after its Close.
		if !l.xl.acquire() {
			return nil, opError("accept", l.addr, ErrClosed)
		}
		x, err := l.xep.AcceptIn(ctx, l.term)
		if err != nil {
			l.xl.release()
			return nil, l.xrcAcceptErr(err)
		}
		// closeXRC calls the release once (releaseOnce).
		return newXRCConn(x, l.cfg, func() { l.xl.release() }), nil
	}
	// Close's drain of ready waits for its handshakes (a time-wait, maybe):
	// until then a select would pick ready half the time.
	if l.isClosed() {
		return nil, l.closedErr()
	}
	// An ended ctx is the answer, as Send's and Recv's, whatever waits in
	// ready, which stays for the next Accept: the select below picked
	// either at random, and a server that cancelled its context to stop
	// accepting got one more connection half the time
	// (TestAcceptWithEndedContextSaysSo).
	if err := ctx.Err(); err != nil {
		return nil, opError("accept", l.addr, err)
	}
	select {
	case c := <-l.ready:
		<-l.inProgress
		if l.isClosed() {
			c.close(true, false) // what Close would have done with it
			return nil, l.closedErr()
		}
		return c, nil
	case <-l.done:
		return nil, l.closedErr()
	case <-ctx.Done():
		return nil, opError("accept", l.addr, ctx.Err())
	}
}

// xrcAcceptErr is the error of an XRC listener's Accept whose AcceptIn
// failed with err. An endpoint that died of its kernel's failure (its
// process, an event channel) accepts nothing more: the listener is closed
// for good, and says so as an RC listener that failed does (closedErr),
// with ErrClosed and the cause in words only. The cause's errno (ENOMEM,
// EAGAIN) would make the error Temporary, and net/http's Serve retries a
// temporary Accept error for ever. A removed device stays ErrDeviceRemoved,
// as an RC listener's.
func (l *Listener) xrcAcceptErr(err error) error {
	err = mapXRCSetupErr(err)
	if l.xep.Err() != nil && !errors.Is(err, ErrClosed) && !errors.Is(err, ErrDeviceRemoved) &&
		!errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("%w: the listener failed: %v", ErrClosed, err)
	}
	return opError("accept", l.addr, err)
}

// ok reports whether l was made by Listen (a nil or zero Listener is
// closed, with nothing to close).
func (l *Listener) ok() bool { return l != nil && l.done != nil }

// xrcOnly reports whether the listener is an XRC endpoint alone (WithFabric,
// or XRCRequire on a device with XRC), with no RC id beside it.
func (l *Listener) xrcOnly() bool { return l.xep != nil && l.id == nil }

// isClosed reports whether Close has begun.
func (l *Listener) isClosed() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

// closedErr is Accept's error once the listener is closed.
func (l *Listener) closedErr() error {
	if err := l.failed.Load(); err != nil {
		// The listener closed itself for good: ErrClosed, with the
		// reason in words only. An errno of the reason's (ENOMEM,
		// EAGAIN) would make the error Temporary, and net/http's Serve
		// retries a temporary Accept error for ever.
		return opError("accept", l.addr, fmt.Errorf("%w: the listener failed: %v", ErrClosed, *err))
	}
	if l.removed.Load() {
		return opError("accept", l.addr, ErrDeviceRemoved)
	}
	return opError("accept", l.addr, ErrClosed)
}

// loop takes connection requests off the listening id; each handshake runs
// in its own goroutine, so a slow or silent dialer holds up nobody else.
func (l *Listener) loop() {
	defer l.wg.Done()
	for {
		// Close ends the wait (l.ctx) before it closes the id: see Close.
		ev, err := l.id.Event(l.ctx)
		if err != nil {
			if l.ctx.Err() == nil && !errors.Is(err, rdmacm.ErrClosed) {
				// The event channel broke: nothing will come. Accept
				// says why, rather than wait for ever.
				l.cfg.logger.Warn("listener failed", "addr", l.addr, "err", err)
				l.failed.Store(&err)
				go l.Close()
			}
			return
		}
		if ev.Type == rdmacm.EventDeviceRemoval {
			// The kernel has destroyed the listening id; the rest
			// must go at once, or the device's removal waits for it.
			l.cfg.logger.Warn("listener's RDMA device removed", "addr", l.addr)
			l.removed.Store(true)
			go l.Close()
			return
		}
		if ev.Type != rdmacm.EventConnectRequest {
			l.cfg.logger.Debug("listener event ignored", "event", ev.Type)
			continue
		}
		select {
		case l.inProgress <- struct{}{}:
		default:
			globalStats.acceptErrors.Add(1)
			l.cfg.logger.Warn("connection request rejected: backlog full", "remote", Addr{ev.ID.RemoteAddr()}, "backlog", cap(l.inProgress))
			ev.ID.Reject(nil)
			ev.ID.Close()
			continue
		}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			if !l.handshake(ev) {
				<-l.inProgress
			}
		}()
	}
}

// watchFatal closes the listener when its device reports DEVICE_FATAL
// (async.go), as loop does on the CM's DEVICE_REMOVAL, which a device that
// fails need not send: no request comes through a dead device, and Accept
// waited for ever. Accept says ErrDeviceRemoved. It ends with Close.
func (l *Listener) watchFatal() {
	select {
	case <-l.dev.fatal:
		l.cfg.logger.Warn("listener's RDMA device failed", "addr", l.addr)
		l.removed.Store(true)
		l.Close()
	case <-l.done:
	}
}

// handshake accepts one connection request: checks the dialer's hello,
// builds the QP and moves it to RTS before accepting (the CM does not own
// it), then waits for the dialer's confirmation, which the kernel would wait
// for indefinitely, under the handshake timeout. It reports whether the
// connection went to ready for Accept.
func (l *Listener) handshake(ev rdmacm.Event) bool {
	id := ev.ID
	raddr := Addr{id.RemoteAddr()}
	cfg := l.cfg
	reject := func(reason error) {
		globalStats.acceptErrors.Add(1)
		cfg.logger.Warn("connection request rejected", "remote", raddr, "reason", reason)
		id.Reject(nil)
		id.Close()
	}
	if l.ctx.Err() != nil { // taken off the id just before Close
		id.Reject(nil)
		id.Close()
		return false
	}
	var peer hello
	if !cfg.raw {
		h, err := peerHello(ev)
		if err != nil {
			reject(err)
			return false
		}
		peer = h
	}
	sendSlots, recvSlots, hdr := cfg.slots()
	sendSize := cfg.messageSize + hdr
	if !cfg.raw {
		// Never more than our own depth: the peer's hello must not choose
		// how much memory we register (agree caps credits to these slots).
		sendSlots = min(int(peer.queueDepth)+1, sendSlots)
		sendSize = min(cfg.messageSize, int(peer.maxMessage)) + hdr
	}
	// The QP goes to RTS in one step: the request named the peer's QP, and
	// the peer sends nothing before our accept, by which time the
	// receives below are posted. It holds the read resources we accept,
	// the request's up to readDepth, not the request's own, which the
	// CM would give it before the accept (librdmacm's defaults offer the
	// peer device's maximum) and which the REP would contradict.
	moves := rdmacm.MoveParams{
		MinRNRTimer:        minRNRTimer,
		ResponderResources: min(ev.Conn.ResponderResources, readDepth),
		InitiatorDepth:     min(ev.Conn.InitiatorDepth, readDepth),
	}
	t, err := newRDMATransport(id, verbs.QPStateRTS, moves, sendSlots, recvSlots, sendSize, cfg.messageSize+hdr, cfg.inlineThreshold)
	if err != nil {
		reject(err)
		return false
	}
	cfg.fitDevice(t.maxMessage())
	t.ch = l.ch.acquire()
	l.holdDevice(t.dev, id.LocalAddr().Addr())
	// The id's own address, not the listener's: that may be unspecified.
	c, err := newConn(t, Addr{id.LocalAddr()}, raddr, cfg.params(sendSlots, recvSlots))
	if err == nil && !cfg.raw {
		c.agree(peer, cfg)
	}
	if err == nil {
		err = c.postAllRecvs()
	}
	if err != nil {
		globalStats.acceptErrors.Add(1)
		cfg.logger.Warn("connection request rejected", "remote", raddr, "reason", err)
		id.Reject(nil)
		t.free()
		return false
	}
	cp := rdmacm.ConnParam{QPNum: t.qp.Num(), ResponderResources: moves.ResponderResources, InitiatorDepth: moves.InitiatorDepth, RNRRetryCount: 7}
	if !cfg.raw {
		cp.PrivateData = hello{queueDepth: uint16(cfg.queueDepth), maxMessage: uint32(cfg.messageSize), probe: t.probeTarget()}.marshal()
	}
	if l.ctx.Err() != nil {
		// Closed meanwhile: refuse rather than accept a connection
		// nobody will take (the dialer would see it fail after its
		// Dial returned).
		id.Reject(nil)
		t.free()
		return false
	}
	if err := id.Accept(cp); err != nil {
		globalStats.acceptErrors.Add(1)
		cfg.logger.Warn("handshake failed", "remote", raddr, "err", err)
		t.free()
		return false
	}
	// The wait ends at the handshake timeout or when the listener closes.
	ctx, cancel := context.WithTimeout(l.ctx, cfg.handshakeTimeout)
	_, err = id.WaitEvent(ctx, rdmacm.EventEstablished)
	cancel()
	if err == nil && l.ctx.Err() != nil {
		err = ErrClosed
	}
	if err != nil {
		globalStats.acceptErrors.Add(1)
		cfg.logger.Warn("handshake failed", "remote", raddr, "err", err)
		t.free()
		return false
	}
	if err := c.start(t); err != nil {
		globalStats.acceptErrors.Add(1)
		cfg.logger.Warn("handshake failed", "remote", raddr, "err", err)
		return false
	}
	select {
	case l.ready <- c:
		return true
	case <-l.done:
		c.Close()
		return false
	}
}

// Close stops listening. Pending Accepts return ErrClosed, handshakes in
// progress are abandoned, and connections not yet accepted are closed.
// Connections already accepted stay open. Over XRC (an in-memory fabric, or
// an XRC mode on a device with XRC) new requests are refused at once, but
// the port stays bound for XRC until the last accepted XRC connection
// closes: the listener's XRC endpoint carries them, and their peers recover
// their legs through it (an XRCPrefer listener's RC port is free at once).
// A Listen on the address with the same message size, queue depth, domain
// path and handshake timeout takes that endpoint over meanwhile; one with
// other options fails with EADDRINUSE. Close is idempotent.
func (l *Listener) Close() error {
	if !l.ok() {
		return nil
	}
	var err error
	l.closeOnce.Do(func() {
		close(l.done)
		if l.stop != nil {
			l.stop()
		}
		if l.xep != nil {
			err = l.xl.stopListening()
		}
		if l.xrcOnly() {
			globalStats.listeners.Add(-1)
			return
		}
		// The loop and the handshakes end with l.ctx (stop). Requests
		// that come meanwhile wait on the id, whose Close rejects them.
		l.wg.Wait()
		// The device's kept objects (cached QPs; with the last user its
		// PD, buffers and probes) go before the listening id, which may
		// be the last CM id on a device without an anchor: librdmacm
		// closes a removed device's context with its last id (see
		// anchor). The connections not yet accepted (ready) and those
		// accepted hold the device and their own ids.
		if l.dev != nil {
			if l.id.DeviceRemoved() {
				l.dev.removed()
			}
			l.dev.dropListener()
		}
		l.dropHeldDevices() // after the handshakes (wg), which hold them
		// Rejects the requests left.
		err = errors.Join(err, l.id.Close())
		// Each Close waits for its connection's time-wait (2 s on
		// soft-RoCE): they wait together.
		var closing sync.WaitGroup
		for {
			select {
			case c := <-l.ready:
				closing.Go(func() { c.Close() })
				continue
			default:
			}
			break
		}
		closing.Wait()
		err = errors.Join(err, l.ch.release())
		globalStats.listeners.Add(-1)
	})
	if err != nil {
		return opError("close", l.addr, err)
	}
	return nil
}

// NetListener returns l as a net.Listener whose connections are NetConn
// stream adapters, for servers such as net/http (whose Shutdown closes the
// listener, then waits for the requests in flight).
func (l *Listener) NetListener() net.Listener { return netListener{l} }

type netListener struct{ l *Listener }

func (n netListener) Accept() (net.Conn, error) {
	c, err := n.l.Accept(context.Background())
	if err != nil {
		return nil, err
	}
	return c.NetConn(), nil
}

func (n netListener) Close() error   { return n.l.Close() }
func (n netListener) Addr() net.Addr { return n.l.Addr() }
