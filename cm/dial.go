package cm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/internal/rdmaaddr"
	"github.com/goxrc/goxrc/rdmacm"
	"github.com/goxrc/goxrc/verbs"
)

// Dial connects to the listener at address ("ip:port"; IPv6 in brackets),
// resolving the address and route and choosing the device the route leads
// to. A host name is looked up (WithResolver picks the resolver) and its
// addresses are tried in turn until one connects, each with a share of the
// time, as net.Dial does; the error is the first's, and each failure is
// logged when there are several. Unlike net.Dial, the unspecified address
// (":port", "0.0.0.0:port", "[::]:port") is refused (ErrInvalid): no RDMA
// device sits on the loopback it stands for.
// ctx bounds the whole Dial (look-up, every address tried, the handshake);
// without a deadline the handshake timeout bounds it. Running out of that
// time fails it with an error matching context.DeadlineExceeded and
// os.ErrDeadlineExceeded, also in address or route resolution, where the
// kernel's ETIMEDOUT comes a moment before the deadline. In an XRC mode (WithXRC) on a device
// with XRC, the connection runs through the process's XRC dialer endpoint
// for that device and local address (package xrc), shared by the Dials
// with the same message size, queue depth, domain path and handshake
// timeout, and closed with the last of their connections. The connection
// outlives ctx.
//
// Over RC, like `rping -c -a ADDR -p PORT`: the same port space
// (RDMA_PS_TCP), not the same protocol.
func Dial(ctx context.Context, address string, opts ...Option) (*Conn, error) {
	return dialFamily(ctx, "ip", address, opts)
}

// dialFamily is Dial of an address of family ("ip": either, "ip4" or "ip6").
func dialFamily(ctx context.Context, family, address string, opts []Option) (_ *Conn, err error) {
	defer func() {
		if err != nil {
			// Every failed Dial, also one refused before it tried (its
			// options, its local address), as DialContext's bad network.
			globalStats.dialErrors.Add(1)
		}
	}()
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, &OpError{Op: "dial", Addr: address, Err: err}
	}
	if cfg.local.IsValid() && !cfg.local.IsUnspecified() {
		// A name's addresses of the other family could not be reached
		// from it (net.Dialer's rule): dial skips them. An unspecified
		// one binds nothing (dialAddr) and reaches either, as
		// net.Dialer's wildcard LocalAddr does.
		lf := "ip4"
		if cfg.local.Is6() {
			lf = "ip6"
		}
		if family != "ip" && family != lf {
			// The network and the option contradict each other:
			// ErrInvalid, with net.Dialer's error.
			mismatch := &net.AddrError{Err: "mismatched local address type", Addr: cfg.local.String()}
			return nil, &OpError{Op: "dial", Addr: address, Err: fmt.Errorf("%w (%w)", mismatch, ErrInvalid)}
		}
	}
	try := func(ctx context.Context, dst netip.AddrPort) (*Conn, error) { return dialAddr(ctx, dst, cfg) }
	if cfg.fabric != nil {
		// The in-memory fabric: always XRC, from the node's one address.
		k, _ := kernel.Unwrap(cfg.fabric) // newConfig refused a zero Process
		node := k.LocalAddr()
		if cfg.local.IsValid() && !cfg.local.IsUnspecified() && cfg.local.WithZone("") != node.WithZone("") {
			// Not this host's address: the device's answer (and bind's).
			// A zone names the link, and the fabric is one.
			return nil, &OpError{Op: "dial", Addr: address, Err: fmt.Errorf("cm: local address %s is not the fabric node's (%s): %w", cfg.local, node, syscall.EADDRNOTAVAIL)}
		}
		site := cfg.fabricSite(node)
		try = func(ctx context.Context, dst netip.AddrPort) (*Conn, error) {
			return dialXRC(ctx, dst, cfg, site)
		}
	}
	return dial(ctx, family, address, cfg, try)
}

// dial resolves address and tries its addresses in turn until one
// connects, as net.Dial does with a name that has several.
func dial(ctx context.Context, family, address string, cfg config, try func(context.Context, netip.AddrPort) (*Conn, error)) (*Conn, error) {
	ctx, cancel := withDefaultTimeout(ctx, cfg.handshakeTimeout)
	defer cancel()
	dsts, err := resolveAddrs(ctx, cfg.resolver, family, address)
	if err == nil && cfg.local.IsValid() && !cfg.local.IsUnspecified() {
		// The name is looked up in the network's families, as net.Dialer
		// does, and its addresses of the other family skipped: one with
		// none of the local address's is no suitable address, not a
		// name that does not exist.
		dsts, err = reachableFrom(dsts, cfg.local, address)
	}
	if err != nil {
		// Named as given: there is no address to name.
		return nil, &OpError{Op: "dial", Addr: address, Err: err}
	}
	return dialEach(ctx, dsts, func(ctx context.Context, dst netip.AddrPort) (c *Conn, err error) {
		if dst.Addr().WithZone("").IsUnspecified() { // a zone does not make "::" a peer
			// net.Dial takes it for the local system, but no RDMA device
			// sits on the loopback: a device's rdma_resolve_route failed
			// ENODEV, the fabric EHOSTUNREACH.
			err = &OpError{Op: "dial", Addr: dst.String(), Err: fmt.Errorf("cm: the unspecified address names no peer (dial a device's address): %w", ErrInvalid)}
		} else {
			c, err = try(ctx, dst)
		}
		if err != nil && len(dsts) > 1 {
			cfg.logger.Info("dial: an address of the name failed", "name", address, "addr", dst, "err", err)
		}
		return c, err
	})
}

// minDialShare is the least time an address gets when a name has several,
// if that much is left (net.Dialer's rule and figure).
const minDialShare = 2 * time.Second

// dialEach tries dsts in order until one connects, each with an equal
// share of the time left (at least minDialShare), and returns the first
// error when none does.
func dialEach(ctx context.Context, dsts []netip.AddrPort, try func(context.Context, netip.AddrPort) (*Conn, error)) (*Conn, error) {
	var first error
	for i, dst := range dsts {
		actx, cancel := ctx, context.CancelFunc(func() {})
		if dl, ok := ctx.Deadline(); ok && i < len(dsts)-1 {
			left := time.Until(dl)
			actx, cancel = context.WithTimeout(ctx, max(left/time.Duration(len(dsts)-i), min(minDialShare, left)))
		}
		c, err := try(actx, dst)
		cancel()
		if err == nil {
			return c, nil
		}
		if first == nil {
			first = err
		}
		if ctx.Err() != nil {
			break
		}
	}
	return nil, first
}

// dialAddr resolves the route to dst on a device and connects over RC, or,
// in an XRC mode on a device with XRC, hands the connection to the
// device's XRC dialer endpoint.
func dialAddr(ctx context.Context, dst netip.AddrPort, cfg config) (_ *Conn, err error) {
	raddr := Addr{dst}
	fail := func(err error) error { return opError("dial", raddr, err) }

	ch, err := acquireDialChan()
	if err != nil {
		return nil, fail(err)
	}
	id, err := ch.ch.CreateID(rdmacm.PortSpaceTCP, verbs.QPTypeRC)
	if err != nil {
		ch.release()
		return nil, fail(err)
	}
	var t *rdmaTransport
	defer func() {
		if err != nil {
			gone := id != nil && id.DeviceRemoved() || t != nil && t.dev.failed()
			if gone && !errors.Is(err, ErrDeviceRemoved) {
				// The device went while we waited, or failed (a QP
				// move or a post then fails EIO): say so, as a
				// connection's and a listener's errors do.
				err = fail(fmt.Errorf("%w: %w", ErrDeviceRemoved, errors.Unwrap(err)))
			}
			if t != nil {
				t.free()
			} else if id != nil {
				id.Close()
				ch.release()
			}
		}
	}()
	src := netipZero
	switch {
	case cfg.local.IsValid() && !cfg.local.IsUnspecified():
		src = netip.AddrPortFrom(cfg.local, 0) // checkDevice checks it is on cfg.device
	case cfg.device != "" && dst.Addr().IsLinkLocalUnicast() && dst.Addr().Zone() != "":
		// The zone picks the interface; checkDevice checks its device.
	case cfg.device != "":
		// Bind to the device's own address, so the route leaves through it.
		ip, err := rdmaaddr.AddrOf(cfg.device, dst.Addr())
		if err != nil {
			return nil, fail(err)
		}
		src = netip.AddrPortFrom(ip, 0)
	}
	if err := id.ResolveAddr(ctx, src, dst); err != nil {
		if cfg.local.IsValid() && src.Addr() == cfg.local {
			// The kernel's errno does not say which end it is about.
			why := ""
			if _, derr := rdmaaddr.DeviceOf(cfg.local); errors.Is(derr, syscall.EADDRNOTAVAIL) {
				why = " (not an address of this host)"
			} else if derr != nil {
				why = " (not on an RDMA device's netdev)"
			}
			err = fmt.Errorf("from local address %s%s: %w", cfg.local, why, err)
		}
		return nil, fail(err)
	}
	if err := cfg.checkDevice(id); err != nil {
		return nil, fail(err)
	}
	useXRC, err := cfg.checkXRC(id)
	if err != nil {
		return nil, fail(err)
	}
	if useXRC {
		// The route leads to a device with XRC: the resolution told us
		// which device and local address; the engine does the rest. The
		// id stays resolved meanwhile: with XRCPrefer, a peer with no
		// XRC listener on the port is dialed on it over RC.
		site := cfg.deviceSite(id)
		c, useRC, xerr := dialXRCPrefer(ctx, dst, cfg, site)
		if !useRC {
			id.Close()
			ch.release()
			id = nil
			return c, xerr
		}
		defer func() {
			if err != nil {
				forgetNoXRC(site, dst)
			}
		}()
	}
	if err := id.ResolveRoute(ctx); err != nil {
		if dst.Addr().IsLoopback() {
			// The kernel's ENODEV does not say why.
			err = fmt.Errorf("%w: a loopback address has no route over RDMA; dial an address of the RDMA device's netdev", err)
		}
		return nil, fail(err)
	}
	sendSlots, recvSlots, hdr := cfg.slots()
	// The dialer does not know the peer's limits yet: size send slots for
	// its own, and send at most what the peer agrees to.
	t, err = newRDMATransport(id, verbs.QPStateInit, dialerMoves, sendSlots, recvSlots, cfg.messageSize+hdr, cfg.messageSize+hdr, cfg.inlineThreshold)
	if err != nil {
		return nil, fail(err)
	}
	cfg.fitDevice(t.maxMessage())
	t.ch = ch
	p := cfg.params(sendSlots, recvSlots)
	c, err := newConn(t, Addr{id.LocalAddr()}, raddr, p)
	if err != nil {
		return nil, fail(err)
	}
	// Receives go up before the connect: a raw-mode peer such as
	// rdma_server may send the moment it accepts.
	if err := c.postAllRecvs(); err != nil {
		return nil, fail(err)
	}
	cp := rdmacm.ConnParam{QPNum: t.qp.Num(), ResponderResources: readDepth, InitiatorDepth: readDepth, RetryCount: rdmacm.RetryCountFinite, RNRRetryCount: 7}
	if !cfg.raw {
		cp.PrivateData = hello{queueDepth: uint16(cfg.queueDepth), maxMessage: uint32(cfg.messageSize), probe: t.probeTarget()}.marshal()
	}
	if err := id.Connect(cp); err != nil {
		return nil, fail(err)
	}
	ev, err := id.WaitEvent(ctx, rdmacm.EventConnectResponse)
	if err != nil {
		return nil, fail(err)
	}
	if !cfg.raw {
		h, err := peerHello(ev)
		if err != nil {
			id.Reject(nil) // abort: the acceptor must not wait for an RTU
			return nil, fail(err)
		}
		c.agree(h, cfg)
	}
	if err := t.connect(); err != nil {
		id.Reject(nil)
		return nil, fail(rejectedMeanwhile(ctx, id, err))
	}
	if err := id.Establish(); err != nil {
		return nil, fail(rejectedMeanwhile(ctx, id, err))
	}
	if err := c.start(t); err != nil {
		t, id = nil, nil // released with the connection
		return nil, fail(err)
	}
	cfg.logger.Debug("connected", "remote", raddr, "local", c.laddr, "device", t.dev.name)
	return c, nil
}

var netipZero = Addr{}.AddrPort

// idRemoved is id.DeviceRemoved, the CM's DEVICE_REMOVAL on the id,
// flagged as the event is queued. A variable for tests: only librdmacm's
// event pump flags it, and no id exists without a device.
var idRemoved = (*rdmacm.ID).DeviceRemoved

// rejectedMeanwhile explains a failure to finish the connection (the QP's
// move to RTS, whose attributes come from the CM, or the RTU): the acceptor
// may have destroyed its id after its REP (its listener closed, or its
// handshake timed out), and its CM's reject ends ours. The reject's event
// follows the failure closely; wait for it briefly.
func rejectedMeanwhile(ctx context.Context, id *rdmacm.ID, err error) error {
	ctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	ev, werr := id.WaitEvent(ctx, rdmacm.EventEstablished)
	var re *rdmacm.RejectError
	if errors.As(werr, &re) || ev.Type == rdmacm.EventConnectError {
		return werr
	}
	return err
}

// withDefaultTimeout bounds ctx by d unless it already has a deadline.
func withDefaultTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}

// checkDevice fails when WithDevice names another device than the one the
// address leads to (a listener's explicit address on another device, say).
func (cfg *config) checkDevice(id *rdmacm.ID) error {
	if cfg.device != "" && id.DeviceName() != cfg.device {
		return fmt.Errorf("address is on device %s, not %s: %w", id.DeviceName(), cfg.device, ErrInvalid)
	}
	return nil
}

// slots returns the buffer counts and per-message overhead (room for
// SendWithImm's data) of this configuration:
// one receive beyond the queue depth is kept for credit returns, and a
// sender needs a slot for each receive the peer may post.
func (cfg *config) slots() (sendSlots, recvSlots, hdr int) {
	if cfg.raw {
		return cfg.queueDepth, cfg.queueDepth, 0
	}
	return cfg.queueDepth + 1, cfg.queueDepth + 1, userImmLen
}

// fitDevice caps the message size at what the device takes in one work
// request (maxMessage: 1 GiB on mlx5, WithMessageSize's most), less the
// frame header: a longer Send failed on the device and broke the
// connection. As a peer's smaller limit does, it lowers MaxMessageSize,
// and a longer Send gets ErrMessageTooLong. Called once the transport is
// made (its slots are capped alike), before the hello and the
// connection's limits are made from the size.
func (cfg *config) fitDevice(maxMsg int) {
	if _, _, hdr := cfg.slots(); maxMsg > hdr {
		cfg.messageSize = min(cfg.messageSize, maxMsg-hdr)
	}
}

func (cfg *config) params(sendSlots, recvSlots int) connParams {
	log := cfg.logger
	return connParams{
		raw: cfg.raw, sendSlots: sendSlots, recvSlots: recvSlots, peerSlots: recvSlots,
		maxSend: cfg.messageSize, maxRecv: cfg.messageSize, timeout: cfg.handshakeTimeout,
		busyPoll: cfg.busyPoll, keepalive: cfg.keepalive,
		log:     func(msg string, args ...any) { log.Warn(msg, args...) },
		logInfo: func(msg string, args ...any) { log.Info(msg, args...) },
	}
}

// agree applies the peer's handshake: send no more than it accepts, and no
// more frames than it has receive buffers.
func (c *Conn) agree(h hello, cfg config) {
	c.maxSend = min(cfg.messageSize, int(h.maxMessage))
	c.peerSlots = min(int(h.queueDepth)+1, cap(c.freeSend))
	c.credits = c.peerSlots
	c.recvBatch = repostBatch(c.peerWindow())
	c.peerProbe = h.probe
}

// start hands the established connection to its CM watcher. Where the
// device reported DEVICE_FATAL before the connection joined it (addConn),
// which fails it, or as it joined, or the CM its removal (DEVICE_REMOVAL,
// queued on the id for the watcher), start returns ErrDeviceRemoved once
// the connection is released: Dial fails, as over XRC, whose engine fails
// a dial its device's failure reaches, and the listener drops it, rather
// than hand out a connection whose first call says the device is gone.
// Such a connection logs no failure: no connection was handed out, and
// Dial's error or the listener's failed handshake says what happened.
func (c *Conn) start(t *rdmaTransport) error {
	t.onPeerGone = c.peerGone
	t.onDeviceRemoved = c.deviceRemoved
	t.onAsync, t.port = c.takeAsyncEvent, t.id.Port()
	// Everything Close reads is set before the device's event reader can
	// see the connection: a fatal device event closes it from there.
	c.startKeepalive()
	t.inAsync = true
	// Before addConn too: the release waits for the watcher started
	// after it.
	t.watching = true
	globalStats.connsOpen.Add(1)
	c.mu.Lock()
	c.joining = true
	c.mu.Unlock()
	t.dev.addConn(t)
	go t.watch()
	if idRemoved(t.id) {
		// Here rather than wait for the watcher, which ends without it
		// where the channel fails; its own call after is a second loss.
		c.deviceRemoved()
	}
	// A loss heard until here (addConn's, the event reader's or the
	// watcher's just after it) drops the connection; one after, a
	// connection handed out fails of it. A failure meanwhile (the peer's
	// disconnect, which the watcher handled before the loss, say) waited
	// here to be logged (failureLogsLocked): not for a dropped one.
	c.mu.Lock()
	c.joining = false
	lost := c.devLost
	if lost {
		c.failLogs = nil
	}
	logs := c.failureLogsLocked()
	c.mu.Unlock()
	if lost {
		<-c.freed // deviceLost's Close released it, t with it
		return fmt.Errorf("%w as the connection was established", ErrDeviceRemoved)
	}
	c.logFailures(logs)
	globalStats.connsTotal.Add(1)
	return nil
}
