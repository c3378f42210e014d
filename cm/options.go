package cm

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/xrc"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// Limits on what a connection may be configured with, and what a peer may ask
// for in its handshake.
const (
	minQueueDepth  = 2    // see WithQueueDepth
	maxQueueDepth  = 4000 // credits travel in 12 bits (checked in frame.go)
	minMessageSize = 1
	maxMessageSize = 1 << 30

	// DefaultQueueDepth is how many messages a connection takes in
	// before its sender waits: its receive buffers (a framed connection
	// posts one more, for credit returns). On RC a sender is held to the
	// smaller of the two sides' depths; over XRC to its receiver's.
	DefaultQueueDepth = 64
	// DefaultMessageSize is the largest message a connection carries.
	// At the defaults a connection registers 9 MiB a side (a
	// send and a receive buffer per message in flight), pinned memory that
	// a process without CAP_IPC_LOCK needs RLIMIT_MEMLOCK room for.
	DefaultMessageSize = 64 << 10
	// DefaultInlineThreshold is the largest message sent inline (copied
	// into the work request); the device may lower it.
	DefaultInlineThreshold = 64
	// DefaultHandshakeTimeout bounds what has no context deadline: a
	// whole Dial (look-up, resolution, connect), Close's waits, and the
	// acceptor's wait for the dialer's final confirmation, which the kernel
	// does not time out.
	DefaultHandshakeTimeout = 30 * time.Second
)

// XRCMode says whether a connection uses XRC.
type XRCMode int

const (
	// XRCOff uses RC queue pairs only.
	XRCOff XRCMode = iota
	// XRCPrefer uses XRC where the device supports it and falls back to RC
	// with a logged reason elsewhere (soft-RoCE, or a listener on an
	// unspecified address without WithDevice). A Dial also falls back
	// where the peer's CM says that nothing listens for XRC on its port
	// (an RC-only listener), not on other failures; that answer is
	// remembered for 30 seconds (see the package documentation). A
	// listener on a device with XRC takes RC dialers as well as XRC ones.
	XRCPrefer
	// XRCRequire fails with ErrNotSupported, and the reason, where XRC is
	// missing.
	XRCRequire
)

// Transport is what carries a connection (Conn.Transport); the zero value
// is none.
type Transport uint8

const (
	// TransportRC: RC queue pairs of the connection's own, which carry
	// immediate data and one-sided RDMA (and raw messages, with
	// WithRawMessages).
	TransportRC Transport = iota + 1
	// TransportXRC: package xrc's engine, over queue pairs shared by the
	// node's processes (WithXRC on a device with XRC, or WithFabric);
	// framed messages only.
	TransportXRC
)

func (t Transport) String() string {
	switch t {
	case TransportRC:
		return "RC"
	case TransportXRC:
		return "XRC"
	case 0:
		return "none" // a nil or closed Conn's, as the type's doc says
	}
	return fmt.Sprintf("Transport(%d)", int(t))
}

func (m XRCMode) String() string {
	switch m {
	case XRCOff:
		return "off"
	case XRCPrefer:
		return "prefer"
	case XRCRequire:
		return "require"
	}
	return fmt.Sprintf("XRCMode(%d)", int(m))
}

// Option configures Listen and Dial.
type Option func(*config)

type config struct {
	queueDepth       int
	messageSize      int
	inlineThreshold  int
	resolver         *net.Resolver
	device           string
	localAddr        string     // WithLocalAddr, as given
	local            netip.Addr // localAddr parsed (unmapped); invalid when unset
	handshakeTimeout time.Duration
	logger           *slog.Logger
	xrc              XRCMode
	xrcSet           bool // WithXRC was given
	domainPath       string
	raw              bool
	keepalive        time.Duration
	backlog          int
	fabric           *memfabric.Process
	busyPoll         time.Duration
	// xrcHeartbeat and xrcIdle, for tests, are the XRC engine's
	// xrc.Config.Heartbeat and IdleTimeout (0: its defaults), which pace
	// how soon a silent peer's death is decided (TestEndParityRandom's
	// stalled process).
	xrcHeartbeat, xrcIdle time.Duration
}

func newConfig(opts []Option) (config, error) {
	c := config{
		queueDepth:       DefaultQueueDepth,
		messageSize:      DefaultMessageSize,
		inlineThreshold:  DefaultInlineThreshold,
		handshakeTimeout: DefaultHandshakeTimeout,
		busyPoll:         DefaultBusyPoll,
		logger:           slog.New(slog.DiscardHandler),
		backlog:          1024,
	}
	for _, o := range opts {
		if o != nil { // a nil Option, say one chosen by a condition, sets nothing
			o(&c)
		}
	}
	if c.fabric != nil {
		if _, ok := kernel.Unwrap(c.fabric); !ok {
			// Not a node's process (a zero Process): an option the
			// call cannot take.
			return c, fmt.Errorf("cm: WithFabric: %w (%w)", xrc.ErrNoKernel, ErrInvalid)
		}
		// Options that contradict the fabric are refused whatever the
		// address, before it is looked up (WithFabric's doc).
		switch {
		case c.xrcSet && c.xrc == XRCOff:
			return c, fmt.Errorf("cm: the in-memory fabric carries XRC connections only: drop WithXRC(XRCOff): %w", ErrInvalid)
		case c.raw:
			return c, fmt.Errorf("cm: raw messages over XRC (WithFabric): %w", ErrNotSupported)
		}
	}
	if c.localAddr != "" {
		ip, err := netip.ParseAddr(c.localAddr)
		if err != nil {
			return c, fmt.Errorf("cm: local address: %w (%w)", err, ErrInvalid)
		}
		c.local = ip.Unmap()
		if c.local.WithZone("").IsUnspecified() {
			// "::%eth0" is a wildcard too, as net.Dialer's LocalAddr
			// (its net.IP has no zone): an unspecified address picks
			// no interface, so its zone picks nothing either.
			c.local = c.local.WithZone("")
		}
	}
	switch {
	case c.queueDepth < minQueueDepth || c.queueDepth > maxQueueDepth:
		return c, fmt.Errorf("cm: queue depth %d outside [%d, %d]: %w", c.queueDepth, minQueueDepth, maxQueueDepth, ErrInvalid)
	case c.messageSize < minMessageSize || c.messageSize > maxMessageSize:
		return c, fmt.Errorf("cm: message size %d outside [%d, %d]: %w", c.messageSize, minMessageSize, maxMessageSize, ErrInvalid)
	case c.inlineThreshold < 0:
		return c, fmt.Errorf("cm: negative inline threshold %d: %w", c.inlineThreshold, ErrInvalid)
	case c.handshakeTimeout <= 0:
		return c, fmt.Errorf("cm: handshake timeout must be positive: %w", ErrInvalid)
	case c.xrc < XRCOff || c.xrc > XRCRequire:
		return c, fmt.Errorf("cm: unknown XRC mode %d: %w", c.xrc, ErrInvalid)
	case c.busyPoll < 0:
		return c, fmt.Errorf("cm: negative busy-poll time: %w", ErrInvalid)
	case c.keepalive < 0:
		return c, fmt.Errorf("cm: negative keepalive interval: %w", ErrInvalid)
	case c.backlog < 0 || c.backlog > maxBacklog:
		return c, fmt.Errorf("cm: backlog %d out of range 0..%d: %w", c.backlog, maxBacklog, ErrInvalid)
	}
	return c, nil
}

// WithQueueDepth sets the number of receive buffers and so the number of
// messages in flight per direction (default DefaultQueueDepth).
// The smallest depth is 2 and the largest 4000 (credits travel in 12 bits),
// here and in a peer's handshake: at depth 1 a
// data frame needs both of the peer's receive buffers, and two sides that
// both keep sending can pass one credit back and forth in credit frames for
// ever (TestConnEchoFloodNoDeadlock). Over XRC it bounds one direction
// only: the messages this side holds received and not yet taken by Recv,
// however deep the peer's own queue is (see the package documentation).
func WithQueueDepth(n int) Option { return func(c *config) { c.queueDepth = n } }

// WithMessageSize sets the largest message payload (default
// DefaultMessageSize; 1 byte to 1 GiB). Framed peers need not agree: each
// sends at most the smaller of the two limits (MaxMessageSize). Raw peers
// must agree. On RC a connection caps it at what its device takes in one
// message (the port's max_msg_sz) less the 4-byte frame header, which raw
// messages lack: 1 GiB less 4 bytes on mlx5, whose max_msg_sz is 1 GiB;
// 8 MiB less 4 bytes on Debian 12's soft-RoCE, which reports 8 MiB.
// Over XRC it sizes what an endpoint receives, 64 bytes to 1 MiB (a
// smaller size receives 64 bytes, a larger one 1 MiB: MaxRecvSize and
// MaxMessageSize say what holds); a process's Dials share an endpoint only
// with Dials of the same size (as raised or capped).
func WithMessageSize(n int) Option { return func(c *config) { c.messageSize = n } }

// WithInlineThreshold sets the largest payload sent inline (copied into
// the work request). Where the device inlines less, a connection asks for half
// as much until the device takes it, and inlines that (0 where none). RC
// only: over XRC (WithXRC on a device with XRC, or WithFabric) the engine
// posts the sends, and the option has no effect.
func WithInlineThreshold(n int) Option { return func(c *config) { c.inlineThreshold = n } }

// WithDevice forces an RDMA device by name (e.g. "rxe0"): a dial binds to
// the device's own address, so the route must leave through it, and a
// listener on an unspecified address listens on the device's address
// only. An address that cannot be reached through the device fails.
func WithDevice(name string) Option { return func(c *config) { c.device = name } }

// WithLocalAddr makes Dial connect from ip, an address of this host on an
// RDMA device's netdev, as net.Dialer's LocalAddr does (rdma_resolve_addr's
// source address; the CM picks the port): on a host with several
// addresses, it picks the one the peer sees, and with it the device and
// port the connection leaves through. Dial then keeps to ip's family: a
// name's addresses of the other family are skipped, and a literal of the
// other family, or a name with none of ip's, fails with "no suitable
// address found" (a *net.AddrError, as net.Dialer's). An unspecified ip
// (0.0.0.0, ::, or :: with a zone) picks nothing and keeps Dial to no
// family, as a wildcard LocalAddr does net.Dialer's. With WithDevice too, ip must be on that
// device; with WithFabric, it must be the node's.
// Listen ignores it (its address is the local one), but an ip that does
// not parse fails there too, with ErrInvalid, as every option is checked.
//
// The command-line equivalent is `rping -c -I IP -a HOST`
// (or `ucmatose -s HOST -b IP`).
func WithLocalAddr(ip string) Option { return func(c *config) { c.localAddr = ip } }

// WithResolver looks host names up with r instead of net.DefaultResolver,
// as net.Dialer's Resolver field does: a resolver whose PreferGo and Dial
// send the queries to a DNS server of the application's choosing.
func WithResolver(r *net.Resolver) Option { return func(c *config) { c.resolver = r } }

// WithHandshakeTimeout sets what bounds a Dial, Close's waits and the
// acceptor's handshake where no context deadline does
// (DefaultHandshakeTimeout).
func WithHandshakeTimeout(d time.Duration) Option {
	return func(c *config) { c.handshakeTimeout = d }
}

// WithLogger sets a logger for connection events (default: discard).
// Nothing is logged per message. Over RC it logs a Dial's connection (at
// Debug), a listener's refused requests, failed handshakes and failure, a
// connection's failure (once, at Warn), and device and port events. Over
// XRC (WithFabric, or an XRC mode that found XRC) it logs none of these,
// neither a connection nor its failure: only the choice of transport (an
// XRC mode's fallback to RC at Info, a remembered refusal at Debug) and an
// XRCPrefer listener's XRC endpoint failing (at Warn). The engine's own
// events are not logged: ProcessStats counts its uplink recoveries and
// refused requests (XRCRecoveries, XRCRejected). Over either, a Dial of a
// name logs each address that failed before it tries the next (at Info).
//
// Records are written on the goroutine of the event (a Dial, the
// listener's, a call on the connection or its reaper, the device's event
// reader), after it has released the locks that Stats, the addresses,
// Listener.Addr and GlobalStats take: a handler may call those. A slow
// handler holds up that goroutine, and with it, after a failed post, the
// connection's other posts, and on the device's event reader the device's
// later events (an event reaches every connection it concerns before
// their records are written). It must not close the Conn or the Listener
// itself, but from a goroutine of its own: the Listener's Close waits for
// the goroutine that logs a refused request, and the Conn's Close for a
// failed post's goroutine, which still holds the buffers.
func WithLogger(l *slog.Logger) Option {
	return func(c *config) {
		if l != nil {
			c.logger = l
		}
	}
}

// WithXRC selects the transport: RC, or XRC where the device supports it.
// XRC connections run on package xrc's engine: the processes of a node
// share one XRC domain (WithDomainPath), an endpoint (a listener's, or the
// one a process's Dials share) reaches every process of a remote node over
// one INI QP (see Transports in the package documentation). An XRCPrefer
// listener on a device with XRC takes RC dialers too (it listens for both
// on its port); an XRCRequire listener only XRC dialers, and an XRCPrefer Dial to an RC-only listener
// goes on over RC (see XRCPrefer). XRC
// connections carry framed messages only: SendWithImm and one-sided RDMA
// give ErrNotSupported (RecvWithImm receives with no immediate data), and WithRawMessages fails with XRCRequire (and
// WithFabric) and uses RC with XRCPrefer.
//
// Whether a device advertises XRC shows in `ibv_devinfo -d DEV -v` (XRC
// under device_cap_flags).
func WithXRC(m XRCMode) Option { return func(c *config) { c.xrc, c.xrcSet = m, true } }

// WithDomainPath sets the private directory (mode 0700) of the node's XRC
// domain file: processes of a node that use the same directory share one
// XRC domain. Default: goxrc-<euid> (the effective uid, which must own it)
// in the system's temporary directory, where a cleaner of old files may
// delete the domain file (xrc.Config.DomainDir says what follows); on
// long-lived nodes choose a directory under /run.
func WithDomainPath(path string) Option { return func(c *config) { c.domainPath = path } }

// WithRawMessages turns off goxrc's framing: no handshake, no header and no
// credits, one RDMA send per message. That is wire-compatible with plain
// librdmacm peers such as rdma-core's rdma_server and rdma_client examples,
// at the price of flow control: the application must not send more than
// the peer has receive buffers posted. A raw connection keeps its queue
// depth of them posted, less those whose messages Recv has not yet taken:
// each goes back as soon as Recv has copied its message out.
//
// Those peers are `rdma_server -p PORT` and `rdma_client -s ADDR -p PORT`
// (port 7471 by default).
func WithRawMessages() Option { return func(c *config) { c.raw = true } }

// WithKeepalive makes an idle connection probe its peer every d, so a dead
// peer is noticed even when no data flows (0, the default, disables it).
// Framed RC connections only: raw ones send no probes, and XRC connections
// have the engine's heartbeat and idle timeout instead (xrc.Config). A
// probe is an RDMA read of a few bytes the peer registered for it (its
// handshake says where): the peer's device answers it whatever the peer's
// application does, and it takes no credit and no receive buffer. A probe
// to a peer that vanished without a word (power lost, cable cut) fails once
// the transport's retries run out: seven tries, each after the ACK timeout
// the RDMA CM derives from the path (about 15 s in all on soft-RoCE, between
// two guests of test/vm/rxe-pair.sh). The failure reaches the calls blocked
// on the connection; with none blocked, the next call that waits gets it (a
// Recv with nothing queued, a Send out of credit), while a Send that can
// post returns nil, as a TCP write to a dead peer does. One probe is out at
// a time, and the next goes only once a waiting call has taken the last
// one's completion: an application that never waits is told nothing, and
// needs no probes.
func WithKeepalive(d time.Duration) Option { return func(c *config) { c.keepalive = d } }

// WithBacklog bounds a listener's connections in progress: handshakes under
// way plus connections waiting for Accept (default 1024, at most 65535; 0
// counts as 1).
// A request beyond it is rejected at once, as a full TCP accept queue drops
// SYNs: each one costs a QP and registered buffers before its dialer has
// proved anything. It is also the backlog given to rdma_listen. Over XRC
// the engine's own bound applies to the handshakes (256 inbound connections
// not yet accepted; requests beyond are refused with BUSY_RETRY); on a
// listener that takes both transports (XRCPrefer on a device with XRC), its
// XRC connections waiting for Accept hold places of this bound as well, so
// that its RC requests are refused while they fill it.
//
// The kernel caps rdma_listen's backlog at `sysctl net.rdma_ucm.max_backlog`
// (1024 by default).
func WithBacklog(n int) Option { return func(c *config) { c.backlog = n } }

// maxBacklog bounds WithBacklog: the queue of connections waiting for
// Accept is allocated at its size (a huge one panicked Listen after its
// id was listening), and the kernel caps rdma_listen's backlog far below.
const maxBacklog = 1<<16 - 1

// WithBusyPoll sets how long a waiting Send or Recv polls the completion
// queue before sleeping (default DefaultBusyPoll), once the connection has
// had its first completion (see DefaultBusyPoll). Longer trades CPU for
// latency, as busy-polling C programs such as ib_send_lat do; 0 sleeps at
// once. After a wait for the peer's message that slept but ended soon after
// the window, the next waits poll up to twice as long as it took (at most 8
// windows and 2 ms), until a message comes within the window again: two
// peers whose replies come just after the window would otherwise both sleep
// on every message from then on. A peer that is simply slow (the stretched
// window catches its messages late four times running) stops the stretching
// until a message comes within the window, so its gaps are not spun through.
//
// Busy polling wants GOMAXPROCS of 2 or more, even on one CPU (the Go
// runtime sets 1 on a machine with one CPU or a process allowed one by its
// CPU affinity; a CPU quota below 2 still gets 2). A poll runs in
// C, and with a single P the runtime takes the P from a goroutine in a C
// call that lasts across two of its monitor's ticks and wakes another
// thread to look for work, which on one CPU takes turns with the poller.
// Between two one-CPU guests (test/vm/rxe-pair.sh) a 64-byte ping-pong
// polling for 20 ms had a median of 1.2 ms one way at GOMAXPROCS=2 and
// 2.5 ms at 1 (docs/benchmarks-log.md).
//
// A wait that sleeps is woken through Go's netpoller, which costs more than a
// C thread woken in a blocking read: under emulation, a ping-pong that
// sleeps on every message took 2.4-6.3 times as long one way as
// ib_send_lat -e with goxrc, and 2.5-6.0 times with no library
// (test/bench.sh's sleeping rows, test/cmd/cgofloor -events; 6.3 and 3.4 in
// docs/benchmarks.md's run). Spin for as long as a reply usually takes.
//
// RC only: over XRC (WithXRC on a device with XRC, or WithFabric) the
// engine's own goroutines poll the completion queues, and the option has
// no effect.
func WithBusyPoll(d time.Duration) Option { return func(c *config) { c.busyPoll = d } }
