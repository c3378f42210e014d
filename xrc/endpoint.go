package xrc

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/big"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/internal/ring"
	"github.com/goxrc/goxrc/verbs"
	"github.com/goxrc/goxrc/xrc/internal/wire"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// Defaults of Config.
const (
	DefaultHeartbeat        = time.Second
	DefaultIdleTimeout      = 5 * time.Second
	DefaultHandshakeTimeout = 30 * time.Second
	// DefaultRecvWindow is Config.RecvWindow's default.
	DefaultRecvWindow = 64
	// MaxMessageSize is the largest message of the protocol, and
	// Config.MaxMessageSize's default.
	MaxMessageSize = wire.MaxMessage
	// MinMessageSize is Config.MaxMessageSize's least value.
	MinMessageSize = wire.MinMessage
	acceptBacklog  = 256
)

// Config configures an Endpoint.
type Config struct {
	// Process, when set, is the kernel the endpoint runs on: a process of an
	// in-memory fabric (memfabric). When nil, the endpoint runs on a real
	// RDMA device (Device), which must have XRC: elsewhere NewEndpoint fails
	// with an error matching ErrNotSupported that names the device and the
	// reason (soft-RoCE, for one, has no XRC).
	Process *memfabric.Process
	// Device is the RDMA device (e.g. "mlx5_0") of an endpoint without a
	// Process. Empty: the device that holds Addr's IP, which must then be a
	// concrete address (not 0.0.0.0 or ::). With an unspecified Addr the
	// endpoint listens on the device's own address (from its GID table);
	// with a concrete one, the address must be on this device. The
	// endpoint opens the device for itself and closes it in Close. Set
	// Device or Process, not both.
	Device string
	// Addr is the ip:port to listen on; the ip must be the node's (the
	// device's), or unspecified (0.0.0.0 or ::, or empty for 0.0.0.0, as
	// in net.Listen) for the node's own address (on a device, with Device
	// set). Port 0 picks a free port in 30000-49999, one both port spaces
	// have free.
	Addr string
	// DomainDir is the private directory of the node's domain file; every
	// process that uses the same directory on a node shares one XRC domain.
	// Default: goxrc-<euid> in the system temporary directory (the effective
	// uid, which must own the directory). A cleaner that ages that directory
	// (systemd-tmpfiles on some systems) can delete the file under running
	// processes, and processes started after that make a second domain,
	// sharing no TGT with the first: on long-lived nodes, choose a
	// directory no cleaner reaches, such as one under /run.
	DomainDir string
	// Heartbeat is how often an idle sending leg sends a keepalive.
	// 0 or less means DefaultHeartbeat.
	Heartbeat time.Duration
	// IdleTimeout is how long a receiving leg waits without any message
	// (data or keepalive) or MOVE of the leg onto another TGT (the
	// sender's uplink recovering) before it takes the sender for dead and
	// unregisters from its TGT. Keep it several Heartbeats long; it is
	// raised to 2 Heartbeats if shorter. 0 or less means
	// DefaultIdleTimeout.
	IdleTimeout time.Duration
	// HandshakeTimeout bounds Dial when its context has no deadline, and a
	// connection's reverse leg. 0 or less means DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
	// RecvWindow is how many messages a connection may hold received and
	// not yet taken by Recv: the credits its sender starts with (flow
	// control, xrc-protocol.md). A sender that used them all waits in Send
	// until Recv takes some. 0 means DefaultRecvWindow; at most 65535.
	RecvWindow int
	// MaxMessageSize is the largest message the endpoint receives: the
	// size of its SRQ's receive slots, which every sender to it learns when
	// a leg is set up (a larger Send fails with ErrMessageTooLong). 0 means
	// MaxMessageSize (1 MiB); from MinMessageSize (64 bytes) up. On a
	// device the SRQ registers 32 slots of it (plus a frame header each).
	MaxMessageSize int
	// DialOnly makes an endpoint that only dials: it refuses requests for
	// new inbound connections (APP_REJECT, before any kernel object is
	// made) and takes only the reverse legs of its own dials. Its address
	// is every connection's local address, which a peer may dial back.
	DialOnly bool

	// linkLinger, for tests, replaces IdleTimeout as how long a physical
	// link we accepted stays with no leg on it (see lingerLocked).
	linkLinger time.Duration
}

// messageSize fills in MaxMessageSize's default and checks its range.
func (cfg *Config) messageSize() error {
	if cfg.MaxMessageSize == 0 {
		cfg.MaxMessageSize = MaxMessageSize
	}
	if cfg.MaxMessageSize < MinMessageSize || cfg.MaxMessageSize > MaxMessageSize {
		return &OpError{"listen", cfg.Addr, fmt.Errorf("max message size %d outside %d..%d: %w", cfg.MaxMessageSize, MinMessageSize, MaxMessageSize, ErrInvalid)}
	}
	return nil
}

// Endpoint is one process's XRC engine: it opens the node's shared XRC
// domain, receives on its own XRC SRQ, listens on ip:port for both the
// physical (XRC-typed CM) and the virtual (SIDR) exchange, dials remote
// endpoints, and keeps one uplink (INI QP) per remote node and domain and
// one downlink (TGT handle) per remote sender. Applications see only ip:port
// addresses and Conns. Only NewEndpoint makes an Endpoint: a nil or zero one
// is a closed one, as in package cm: its calls return ErrClosed itself (not
// an *OpError), Close returns nil, Err returns ErrClosed (as after Close),
// and its other accessors give their zero values.
type Endpoint struct {
	// owedOff turns the connections' owed-credit timers off (tests of
	// the janitor's fallback look; see owedBounds).
	owedOff bool
	k       kernel.Kernel
	ownK    bool // k is a device the endpoint opened: release closes it
	// devFatal is k's DeviceFatal (nil in tests' bare endpoints).
	devFatal <-chan struct{}
	// procDead is closed once Config.Process has died (nil on a device):
	// the kernel then fails every call with ErrClosed, which is no Close
	// of ours.
	procDead <-chan struct{}
	cfg      Config
	addr     netip.AddrPort
	dom      DomainFile
	xrcd     kernel.XRCD
	srq      kernel.SRQ
	srqn     uint32
	inc      uint64
	acc      *acceptor
	lx, lu   kernel.ID
	// unlistenMu makes a second unlisten (two dies at once) wait until
	// the first has destroyed the listeners: its die must not say the
	// endpoint failed (Err) while they are still in the kernel.
	unlistenMu sync.Mutex

	ctx    context.Context
	cancel context.CancelFunc
	// wg counts spawned goroutines and the Dials under way (enter);
	// spawnMu orders every Add before Close's Wait (spawn's callers may
	// hold mu, so it cannot be mu).
	wg           sync.WaitGroup
	spawnMu      sync.Mutex
	spawnStopped bool

	mu        sync.Mutex
	closed    bool
	dying     bool // die has begun: onRequest refuses BUSY_RETRY before fatal is set
	fatal     error
	uplinks   []*uplink
	addrDom   map[netip.AddrPort]uint64 // which domain an address is in (nodeKey), the last maxAddrDoms learned
	addrOrder []netip.AddrPort          // addrDom's keys, oldest first
	replaced  map[upKey]uint32          // the TGT of a dead uplink, for REPLACES_TGT
	tags      tagSource                 // our conn tags
	pending   map[uint32]*Conn          // dials by our forward tag, until the reciprocal leg
	sendTags  map[uint32]*Conn          // live connections by their sending tag (newTagLocked)
	recv      map[uint32]*Conn          // by our receive tag (the acceptor's tag)
	conns     map[*Conn]struct{}
	passive   map[kernel.ID]*passiveLink // physical links we accepted
	acceptq   chan *Conn
	// iniSetup counts the INIs physLink made that are on no uplink's inis
	// yet: Stats counts them from their CreateINI, as the kernel does.
	iniSetup int
	// refusing is set by StopAccepting (under mu, which checkReadyLocked
	// holds; the acceptor reads it without): new inbound connections are
	// refused, and acceptStop is closed. ResumeAccepting clears it and
	// replaces acceptStop, under mu.
	refusing   atomic.Bool
	acceptStop chan struct{}
	dead       chan struct{} // closed by die: Accept returns fatal
	closeDone  chan struct{} // closed when the first Close has released everything
	// unaccepted counts inbound connections being made, and those in
	// acceptq, finished or not, until they leave it (Conn.unaccepted):
	// at acceptBacklog, requests for more are refused with BUSY_RETRY,
	// which the dialer sees, rather than failed once up, which it would
	// learn only at its idle timeout.
	unaccepted int

	// srqLiars: peer incarnations whose SRQ number named no SRQ of their
	// node (srqliar.go), the last maxSRQLiars; srqLiarOrder, oldest first.
	srqLiars     map[srqLiar]struct{}
	srqLiarOrder []srqLiar

	dropped     atomic.Uint64
	rejected    atomic.Uint64
	recoveries  atomic.Uint64
	moved       atomic.Uint64
	drains      atomic.Uint64 // the number of the last poll that found the SRQ empty (its batch delivered)
	goneSenders atomic.Int32  // connections whose sending leg ended with sendGone, waiting for a drain
	polls       atomic.Uint64 // the receive loop's polls begun
	pollMu      sync.Mutex
	pollBase    context.Context    // the receive loop's polls' context, until kickPoll ends it
	pollStop    context.CancelFunc // ends pollBase
	virtReqs    atomic.Uint64
	oneExchange atomic.Uint64
	abandoned   atomic.Uint64
	creditSent  atomic.Uint64
	overruns    atomic.Uint64
	duplicates  atomic.Uint64
	sqFull      atomic.Uint64
	sidrGoing   atomic.Int64 // SIDR ids of finished exchanges not yet destroyed
	// testAfterDecide, set by a test only, runs in onRequest between the
	// acceptor's decision and what onRequest makes of it.
	testAfterDecide atomic.Pointer[func(decision)]
	// testBeforeReverseLeg, set by a test only, runs in takeReverse
	// between the endpoint's lock and the acceptor's ReverseLeg.
	testBeforeReverseLeg atomic.Pointer[func(*Conn, uint32)]
	// testFINPosted, set by a test only, runs once the goroutine that
	// posts finAcceptedLocked's FIN has done what it does at the post.
	testFINPosted atomic.Pointer[func()]
}

type upKey struct {
	node netip.Addr
	dom  uint64
}

// NewEndpoint opens an endpoint as cfg says and starts listening: on
// cfg.Process, or on a real RDMA device when Process is nil.
func NewEndpoint(ctx context.Context, cfg Config) (*Endpoint, error) {
	if cfg.Process != nil {
		if cfg.Device != "" {
			return nil, &OpError{"listen", cfg.Addr, fmt.Errorf("set Config.Process or Config.Device, not both: %w", ErrInvalid)}
		}
		k, ok := kernel.Unwrap(cfg.Process)
		if !ok {
			return nil, ErrNoKernel
		}
		return newEndpoint(ctx, k, cfg)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	k, err := deviceKernel(&cfg)
	if err != nil {
		return nil, err
	}
	e, err := newEndpoint(ctx, k, cfg)
	if err != nil {
		k.Close()
		return nil, err
	}
	e.ownK = true
	return e, nil
}

func newEndpoint(ctx context.Context, k kernel.Kernel, cfg Config) (_ *Endpoint, err error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = DefaultHeartbeat
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = DefaultIdleTimeout
	}
	if cfg.IdleTimeout < 2*cfg.Heartbeat {
		cfg.IdleTimeout = 2 * cfg.Heartbeat
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if err := cfg.messageSize(); err != nil {
		return nil, err
	}
	if cfg.RecvWindow == 0 {
		cfg.RecvWindow = DefaultRecvWindow
	}
	if cfg.RecvWindow < 0 || cfg.RecvWindow > math.MaxUint16 {
		return nil, &OpError{"listen", cfg.Addr, fmt.Errorf("receive window %d outside 1..%d: %w", cfg.RecvWindow, math.MaxUint16, ErrInvalid)}
	}
	if cfg.DomainDir == "" {
		cfg.DomainDir = filepath.Join(os.TempDir(), fmt.Sprintf("goxrc-%d", os.Geteuid())) // the owner checkOwned wants
	}
	ap, err := parseListenAddr(cfg.Addr)
	if err != nil {
		return nil, &OpError{"listen", cfg.Addr, fmt.Errorf("%w (%w)", err, ErrInvalid)}
	}
	ap = canonicalAddr(ap)
	if !ap.Addr().IsUnspecified() && !sameNode(ap.Addr(), k.LocalAddr()) {
		return nil, &OpError{"listen", cfg.Addr, syscall.EADDRNOTAVAIL}
	}
	ap = netip.AddrPortFrom(k.LocalAddr(), ap.Port())
	if !k.XRC() {
		return nil, &OpError{"listen", cfg.Addr, verbs.ErrNotSupported}
	}
	e := &Endpoint{k: k, cfg: cfg, addrDom: map[netip.AddrPort]uint64{}, replaced: map[upKey]uint32{}, srqLiars: map[srqLiar]struct{}{},
		pending: map[uint32]*Conn{}, sendTags: map[uint32]*Conn{}, recv: map[uint32]*Conn{}, conns: map[*Conn]struct{}{},
		passive: map[kernel.ID]*passiveLink{}, acceptq: make(chan *Conn, acceptBacklog), acceptStop: make(chan struct{}), dead: make(chan struct{}), closeDone: make(chan struct{})}
	dom, f, err := openDomain(ctx, cfg.DomainDir)
	if err != nil {
		return nil, err
	}
	e.dom = dom
	e.devFatal = k.DeviceFatal()
	if pk, ok := kernel.Unwrap(cfg.Process); ok {
		if d, ok := pk.(interface{ Dead() <-chan struct{} }); ok {
			e.procDead = d.Dead()
		}
	}
	defer func() {
		if err != nil {
			e.release()
			if derr := e.deviceErr(); derr != nil {
				// The device failed for good, before or as we opened
				// (its firmware commands fail with EIO): say so.
				err = fmt.Errorf("%w: %w", derr, err)
			} else if pd := e.processErr(); pd != nil {
				// The process died before or as we opened: its calls
				// fail with ErrClosed, which would say a Close of the
				// application's (as die and closedErr say).
				err = fmt.Errorf("%w: %v", pd, err)
			}
		}
	}()
	// The kernel opens the file checked and read, still open (f), not its
	// path again: whoever can write a parent of the domain directory could
	// point the path at a file of its own for that moment, and the XRCD
	// would be keyed to a file that user can open. If another process
	// replaced the file since we read its id, the XRCD is the old file's,
	// which new processes no longer find: read the file at the path again
	// and start over with it.
	for try := 0; ; try++ {
		e.xrcd, err = k.OpenXRCD(domainFD(f), kernel.XRCDCreate)
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("xrc: domain file %s: %w", e.dom.Path, err)
		}
		again, g, err := openDomain(ctx, cfg.DomainDir)
		if err != nil {
			return nil, err
		}
		if again.ID == e.dom.ID {
			g.Close()
			break
		}
		k.CloseXRCD(e.xrcd)
		e.xrcd, e.dom, f = 0, again, g
		if try == 3 {
			g.Close()
			return nil, fmt.Errorf("%w: %s: replaced again and again while the domain was being opened", ErrDomainFile, e.dom.Path)
		}
	}
	if e.srq, e.srqn, err = k.CreateSRQ(e.xrcd, frameSize(cfg.MaxMessageSize)); err != nil {
		return nil, err
	}
	e.inc = random64()
	e.tags = newTagSource()
	ac := acceptorConfig{Kernel: k, XRCD: e.xrcd, DomainID: e.dom.ID, Incarnation: e.inc, SRQN: e.srqn,
		Credits: uint16(cfg.RecvWindow), MaxMessage: uint32(cfg.MaxMessageSize), Drains: e.drains.Load, Polls: e.polls.Load, Kick: e.kickPoll}
	e.refusing.Store(cfg.DialOnly)
	ac.Admit = func(req *wire.Req) ([]byte, *appReject) {
		if e.refusing.Load() && req.Flags&wire.FlagReciprocal == 0 {
			return nil, &appReject{} // not the reverse leg of a dial of ours
		}
		return nil, nil
	}
	e.acc = newAcceptor(ac)
	if err = e.listen(ap); err != nil {
		return nil, err
	}
	e.ctx, e.cancel = context.WithCancel(context.Background())
	lx, lu := e.lx, e.lu // die may take them (unlisten) while the loops start
	e.spawn(func() { e.listenLoop(lx) })
	e.spawn(func() { e.listenLoop(lu) })
	e.spawn(e.recvLoop)
	e.spawn(e.janitor)
	e.spawn(e.watchDevice)
	return e, nil
}

// watchDevice ends the endpoint when its device fails for good: nothing on
// it works any more, and its pollers may wait for completions that never
// come.
func (e *Endpoint) watchDevice() {
	select {
	case <-e.devFatal:
		e.die(e.deviceErr())
	case <-e.ctx.Done():
	}
}

// deviceErr is the error of a device that failed for good, nil before.
func (e *Endpoint) deviceErr() error {
	select {
	case <-e.devFatal:
		return errDeviceFatal
	default:
		return nil
	}
}

// processErr is ErrProcessDied once the endpoint's process has died, nil
// before (and on a device).
func (e *Endpoint) processErr() error {
	select {
	case <-e.procDead:
		return ErrProcessDied
	default:
		return nil
	}
}

// errEndpointEnded is the cause the endpoint's Close (the application's, or
// the one a device failure's die starts) cancels a Dial's context with: its
// Err is context.Canceled, as a caller's cancel. A process death's die
// cancels nothing; its Dial says the death (lostErr).
var errEndpointEnded = errors.New("xrc: the endpoint ended")

var errDeviceFatal = fmt.Errorf("%w: the device reported a fatal error (IBV_EVENT_DEVICE_FATAL)", ErrDeviceRemoved)

// Port 0 picks from these freePorts numbers: two port spaces' listeners
// share the number, so the kernel's own pick (for one space) cannot serve.
const (
	freePortFirst = 30000
	freePorts     = 20000
)

// listen binds the XRC and the SIDR listener on one port number. Port 0
// tries the range from a random place on, up to all of it: processes
// starting together seldom meet, and a crowded node still finds the last
// free number.
func (e *Endpoint) listen(ap netip.AddrPort) error {
	start, _ := rand.Int(rand.Reader, big.NewInt(freePorts))
	for try := int64(0); ; try++ {
		port := ap.Port()
		if port == 0 {
			port = uint16(freePortFirst + (start.Int64()+try)%freePorts)
		}
		a := netip.AddrPortFrom(ap.Addr(), port)
		lx, err := e.k.Listen(a, kernel.ExchangeXRC)
		if err == nil {
			lu, err2 := e.k.Listen(a, kernel.ExchangeSIDR)
			if err2 == nil {
				e.lx, e.lu, e.addr = lx, lu, a
				return nil
			}
			e.k.DestroyID(lx)
			err = err2
		}
		// The kernel says EADDRNOTAVAIL, not EADDRINUSE, where either
		// holder of the port is bound to the wildcard address
		// (cma_check_port); the address itself was checked above.
		taken := errors.Is(err, syscall.EADDRINUSE) || errors.Is(err, syscall.EADDRNOTAVAIL)
		if ap.Port() != 0 || !taken || try == freePorts-1 {
			return &OpError{"listen", a.String(), err}
		}
	}
}

// spawn runs f on a goroutine that Close waits for, and reports whether it
// did. Once Close waits, f does not run: the endpoint is going, and Close
// fails every connection and releases what f would have watched.
func (e *Endpoint) spawn(f func()) bool {
	return e.spawnDone(func() {
		defer e.wg.Done()
		f()
	})
}

// spawnDone is spawn for an f that calls e.wg.Done itself as it ends: made
// once, it starts with no allocation (a credit return, once per half
// window).
func (e *Endpoint) spawnDone(f func()) bool {
	if !e.enter() {
		return false
	}
	go f()
	return true
}

// enter counts a call of the application's that makes kernel objects
// (Dial) in wg, as spawn does a goroutine, and reports whether it did: once
// Close waits, the endpoint is going, and the call makes nothing. The
// caller calls e.wg.Done as it returns.
func (e *Endpoint) enter() bool {
	e.spawnMu.Lock()
	defer e.spawnMu.Unlock()
	if e.spawnStopped {
		return false
	}
	e.wg.Add(1)
	return true
}

func random64() uint64 {
	var b [8]byte
	for {
		rand.Read(b[:])
		if v := binary.BigEndian.Uint64(b[:]); v != 0 {
			return v
		}
	}
}

// ok reports whether e is an endpoint NewEndpoint made (closeDone is made
// with it and never changes): a nil or zero Endpoint is a closed one, whose
// calls fail with ErrClosed itself (it has no address to name) and whose
// accessors give their zero values, as cm's.
func (e *Endpoint) ok() bool { return e != nil && e.closeDone != nil }

// Addr is the ip:port the endpoint listens on.
func (e *Endpoint) Addr() netip.AddrPort {
	if !e.ok() {
		return netip.AddrPort{}
	}
	return e.addr
}

// Accept waits for the next inbound connection, returned once both of its
// legs are up. It accepts in the current term (Term): after StopAccepting
// it returns ErrClosed, also when ResumeAccepting has begun a new term
// meanwhile; a new call accepts in that term.
func (e *Endpoint) Accept(ctx context.Context) (*Conn, error) {
	return e.AcceptIn(ctx, e.Term())
}

// An AcceptTerm is one period in which an endpoint accepts: from its start,
// or a ResumeAccepting, to the next StopAccepting. The zero AcceptTerm has
// ended: AcceptIn with it returns ErrClosed at once (or the endpoint's
// error, if it failed).
type AcceptTerm struct{ stop chan struct{} }

// Term returns the endpoint's current accepting term (one that has ended,
// if StopAccepting ran last).
func (e *Endpoint) Term() AcceptTerm {
	if !e.ok() {
		return AcceptTerm{}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return AcceptTerm{e.acceptStop}
}

// AcceptIn is Accept within term t: once t has ended it returns ErrClosed
// (or the endpoint's error, if it failed), and it takes no connection that
// a later term's Accept should get. A listener that stops and another that
// resumes the endpoint each accept in their own term.
func (e *Endpoint) AcceptIn(ctx context.Context, t AcceptTerm) (*Conn, error) {
	if !e.ok() {
		return nil, ErrClosed
	}
	stop := t.stop
	if stop == nil {
		// The zero term, which has ended before it began: ErrClosed, or
		// the endpoint's error if it failed, as for any ended term.
		return nil, e.closedErr("accept")
	}
	select {
	case <-e.ctx.Done(): // first: a closed endpoint's queue holds dead ones
		return nil, e.closedErr("accept")
	case <-e.dead:
		return nil, e.closedErr("accept")
	case <-stop:
		return nil, e.closedErr("accept")
	default:
	}
	if err := ctx.Err(); err != nil {
		// An ended ctx is the answer, whatever waits in the queue (it
		// stays for the next Accept): the select below picked either
		// at random (cm's TestAcceptWithEndedContextSaysSo).
		return nil, &OpError{"accept", e.addr.String(), err}
	}
	select {
	case c := <-e.acceptq:
		e.mu.Lock()
		defer e.mu.Unlock()
		switch {
		case e.fatal != nil:
			return nil, &OpError{"accept", e.addr.String(), e.fatal}
		case e.closed:
			return nil, &OpError{"accept", e.addr.String(), ErrClosed} // Close closes c
		case closed(c.term):
			// Its term ended meanwhile: StopAccepting's sweep missed it.
			c.closeUnaccepted()
			return nil, &OpError{"accept", e.addr.String(), ErrClosed}
		case c.term != stop:
			// t ended, and c came in the term after: it is for that
			// term's Accept.
			select {
			case e.acceptq <- c:
			default:
				c.closeUnaccepted()
			}
			return nil, &OpError{"accept", e.addr.String(), ErrClosed}
		}
		c.acceptedLocked()
		return c, nil
	case <-ctx.Done():
		return nil, &OpError{"accept", e.addr.String(), ctx.Err()}
	case <-e.ctx.Done():
		return nil, e.closedErr("accept")
	case <-e.dead:
		return nil, e.closedErr("accept")
	case <-stop:
		return nil, e.closedErr("accept")
	}
}

// StopAccepting ends the endpoint's listening part, as a closed net.Listener
// does, and leaves the rest: new inbound connections are refused
// (APP_REJECT, as DialOnly's) until ResumeAccepting, those made and not yet
// taken by Accept are closed, and the Accepts of the term it ends return
// ErrClosed; connections already accepted, and the endpoint's own dials, go
// on until Close. The port stays bound: it is where the endpoint's peers
// move and recover their legs. Idempotent.
func (e *Endpoint) StopAccepting() {
	if !e.ok() {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.stopAcceptingLocked()
}

func (e *Endpoint) stopAcceptingLocked() {
	if e.stopped() {
		return
	}
	e.refusing.Store(true)
	close(e.acceptStop)
	for {
		select {
		case c := <-e.acceptq:
			c.closeUnaccepted()
			continue
		default:
		}
		break
	}
}

// ResumeAccepting undoes StopAccepting: the endpoint accepts new inbound
// connections again (unless it is DialOnly), in a new term, which it
// returns (the current one if it was accepting). An Accept that
// StopAccepting ended stays ended, and the connections it closed stay
// closed.
func (e *Endpoint) ResumeAccepting() AcceptTerm {
	if !e.ok() {
		return AcceptTerm{}
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.resumeAcceptingLocked()
}

func (e *Endpoint) resumeAcceptingLocked() AcceptTerm {
	if e.stopped() {
		e.acceptStop = make(chan struct{})
		e.refusing.Store(e.cfg.DialOnly)
	}
	return AcceptTerm{e.acceptStop}
}

// stopped reports whether StopAccepting has run (and ResumeAccepting has
// not since); e.mu is held.
func (e *Endpoint) stopped() bool { return closed(e.acceptStop) }

// closed reports whether ch is closed.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// Err reports why the endpoint no longer works: ErrClosed after Close,
// ErrProcessDied after its process died (memfabric's Kill, its node's
// PowerOff), an error wrapping ErrDeviceRemoved after its device went away
// or failed, the kernel's error where it failed otherwise; nil while it
// works. A Close after the endpoint failed leaves Err that failure. Once
// it failed (Err not nil, ErrClosed aside) the endpoint listens no more,
// Close or not: peers' dials to its address are refused at once
// (ECONNREFUSED, RejectNoListener), as to a port nobody listens on; close
// it to release the rest. A Close refuses them too, BUSY_RETRY until its
// listeners are gone. Requests already queued at the listeners as it
// failed are refused BUSY_RETRY; where its CM event channel itself broke,
// nothing reads them, and the CM refuses them with its own REJ as the
// listeners go (CONSUMER_DEFINED). An endpoint that refused new
// connections already (DialOnly, or after StopAccepting) refuses them
// APP_REJECT meanwhile, not BUSY_RETRY.
func (e *Endpoint) Err() error {
	if !e.ok() {
		return ErrClosed
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.fatal != nil {
		return e.fatal
	}
	if e.closed {
		return ErrClosed
	}
	// A dead process fails the endpoint from its Kill on, not from when a
	// loop's kernel call says it (die).
	return e.processErr()
}

func (e *Endpoint) closedErr(op string) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.fatal != nil {
		return &OpError{op, e.addr.String(), e.fatal}
	}
	if lost := e.lostErr(); lost != nil && !e.closed {
		return &OpError{op, e.addr.String(), lost} // before die says it
	}
	return &OpError{op, e.addr.String(), ErrClosed}
}

// lostErr is the death of the endpoint's process, else its device's
// failure: either fails the kernel's calls at once, before die says why.
func (e *Endpoint) lostErr() error { return cmp.Or(e.processErr(), e.deviceErr()) }

// Close closes every connection (each sends its FIN, and the peer's FIN
// that answers it is waited for where it can still come: a second at most
// for it all, which a peer that lives but takes nothing in, a stopped
// process, holds up, as does one whose answer waits behind its uplink's
// recovery), stops the endpoint's goroutines and releases every
// kernel object it holds, those of the Dials under way too (they end with
// ErrClosed, and Close waits for them to let go of what they made). It is
// idempotent: a concurrent or later call returns once the first has
// released everything.
func (e *Endpoint) Close() error {
	if !e.ok() {
		return nil
	}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		<-e.closeDone // a second Close returns when everything is released
		return nil
	}
	e.closed = true
	defer close(e.closeDone)
	if e.fatal == nil && e.processErr() != nil {
		// The process died before this Close, and nothing had said so
		// yet (die): that is the endpoint's failure, and its
		// connections' (a later die says ErrClosed: Close came first).
		e.fatal = ErrProcessDied
		close(e.dead)
		for c := range e.conns {
			c.failLocked(ErrProcessDied)
		}
	}
	conns := make([]*Conn, 0, len(e.conns))
	for c := range e.conns {
		c.userClosed = true
		c.wake()
		conns = append(conns, c)
	}
	e.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), min(e.cfg.HandshakeTimeout, time.Second))
	// Our own FINs first, then what is left of the second for closes
	// already under way: one stuck behind a recovering uplink must not
	// take the time of the FINs to healthy peers.
	var underWay []*Conn
	for _, c := range conns {
		if !c.closeFirst(ctx) {
			underWay = append(underWay, c)
		}
	}
	for _, c := range underWay {
		c.awaitClose(ctx)
	}
	// The listeners go before the listen loops end: a request that came
	// after them would wait at a listener nobody reads until release,
	// whose destruction of it refuses it REJ CONSUMER_DEFINED, neither
	// BUSY_RETRY (the loops' answer while Close runs) nor NO_LISTENER
	// (TestCloseRefusesDialsBusyThenNoListener). Those already queued at
	// them, behind a request a loop is still deciding, are answered first,
	// as the loops would (TestCloseAnswersRequestsQueuedBehindADecision).
	if err := e.drainListeners(); err != nil {
		e.die(err) // as the loop that would have read it
	}
	e.unlisten()
	// Then, in what is left of the second, the peers' FINs that answer
	// ours: one that found our SRQ destroyed would fail the peer's INI,
	// and its uplink, healthy, would recover, moving every other leg on it
	// (TestEndpointCloseWaitsForAnsweringFINs).
	for _, c := range conns {
		e.mu.Lock()
		due := c.answerDueLocked()
		e.mu.Unlock()
		if due {
			select {
			case <-c.done:
			case <-ctx.Done():
			}
		}
	}
	cancel()
	e.cancel()
	e.spawnMu.Lock()
	e.spawnStopped = true
	e.spawnMu.Unlock()
	e.wg.Wait()
	e.mu.Lock()
	for c := range e.conns {
		c.failLocked(ErrClosed)
	}
	e.mu.Unlock()
	e.release()
	return nil
}

// release destroys what the endpoint still holds, in the kernel's order: CM
// ids, QPs and TGT handles, the SRQ, the domain.
func (e *Endpoint) release() {
	k := e.k
	e.mu.Lock()
	var inis []*iniQP
	for _, u := range e.uplinks {
		inis = append(inis, u.inis...)
	}
	passive := e.passive
	e.passive = map[kernel.ID]*passiveLink{}
	e.mu.Unlock()
	for id := range passive {
		k.DestroyID(id)
	}
	for _, q := range inis {
		if q.aid != 0 {
			k.DestroyID(q.aid)
		}
		k.DestroyQP(q.qp)
	}
	// Stats counts the INIs until they are destroyed, as the kernel does.
	e.mu.Lock()
	e.uplinks = nil
	e.mu.Unlock()
	e.unlisten()
	if e.acc != nil {
		e.acc.Close()
	}
	if e.srq != 0 {
		k.DestroySRQ(e.srq)
	}
	if e.xrcd != 0 {
		k.CloseXRCD(e.xrcd)
	}
	if e.ownK {
		k.Close()
	}
}

// die is the end of an endpoint whose kernel failed (its process died) or
// whose device went away: every connection fails, and Accept with them,
// and its listeners go (unlisten), so that peers are refused at once.
// After a device removal the endpoint also closes itself: the kernel may
// not finish removing the device while anything of ours is left on it.
func (e *Endpoint) die(err error) {
	var removed error // a DEVICE_REMOVAL read by the drain
	if e.processErr() == nil {
		// Nothing answers a request any more: the listeners go now, not
		// at the application's Close, so that a peer's REQ or SIDR REQ
		// is refused at once (no listener: REJ INVALID_SERVICE_ID, SIDR
		// status 1) rather than queued for nobody until its Dial's
		// deadline; before Err says the endpoint failed. (A dead
		// process's kernel closed them itself.) A request taken off a
		// listener meanwhile is refused BUSY_RETRY (onRequest), and so
		// are those queued behind a loop's decision (drainListeners),
		// which the destroy would refuse REJ CONSUMER_DEFINED
		// (TestDieAnswersRequestsQueuedBehindADecision). Where the CM
		// event channel itself broke, nothing can be drained.
		e.mu.Lock()
		e.dying = true
		e.mu.Unlock()
		removed = e.drainListeners()
		e.unlisten()
	}
	e.mu.Lock()
	if pd := e.processErr(); pd != nil {
		// Its kernel calls fail with ErrClosed, which would say our
		// Close: the process died. Unless our Close had begun: then the
		// application closed it first (as failLocked and closedErr say).
		err = pd
		if e.closed {
			err = ErrClosed
		}
	}
	if e.fatal == nil {
		e.fatal = err
		close(e.dead)
	}
	for c := range e.conns {
		c.failLocked(err)
	}
	e.mu.Unlock()
	if errors.Is(err, ErrDeviceRemoved) || removed != nil {
		go e.Close()
	}
}

// drainListeners answers (onRequest: BUSY_RETRY, as Close or die has begun) the
// requests queued at the listeners that no loop has taken: a loop deciding
// a request leaves the next ones queued, and the listener's destruction
// (unlisten) would refuse them with the CM's own REJ (CONSUMER_DEFINED),
// neither BUSY_RETRY nor NO_LISTENER (Endpoint.Err's doc). Its waits end at
// once: only what is already queued is taken, at most acceptBacklog a
// listener, so that a flood of dialers does not hold Close up. It returns
// the error of a DEVICE_REMOVAL it read, for its caller to die of (die
// itself closes the endpoint then, without a second drain).
func (e *Endpoint) drainListeners() (removed error) {
	e.mu.Lock()
	ls := [2]kernel.ID{e.lx, e.lu}
	e.mu.Unlock()
	now, cancel := context.WithCancel(context.Background())
	cancel()
	for _, l := range ls {
		for range acceptBacklog {
			if l == 0 {
				break
			}
			ev, err := e.k.Event(now, l)
			if err != nil {
				if errors.Is(err, ErrDeviceRemoved) && removed == nil {
					removed = err
				}
				break
			}
			if ev.Type == kernel.EventConnectRequest {
				e.onRequest(ev)
			}
		}
	}
	return removed
}

// listening reports whether l is one of the endpoint's listeners still
// (not yet taken by unlisten).
func (e *Endpoint) listening(l kernel.ID) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return l == e.lx || l == e.lu
}

// unlisten destroys the XRC and the SIDR listener, each once (die, then
// release): a listener whose destroy the kernel refused stays for the next
// call to try again. A call while another destroys them returns once that
// one is done.
func (e *Endpoint) unlisten() {
	e.unlistenMu.Lock()
	defer e.unlistenMu.Unlock()
	e.mu.Lock()
	lx, lu := e.lx, e.lu
	e.lx, e.lu = 0, 0
	e.mu.Unlock()
	var keep [2]kernel.ID
	for i, id := range [2]kernel.ID{lx, lu} {
		if id != 0 && e.k.DestroyID(id) != nil {
			keep[i] = id
		}
	}
	if keep != [2]kernel.ID{} {
		e.mu.Lock()
		e.lx, e.lu = cmp.Or(e.lx, keep[0]), cmp.Or(e.lu, keep[1])
		e.mu.Unlock()
	}
}

// Stats counts an endpoint's objects.
//
// Dropped counts received messages dropped, each once: a failed or empty
// receive; a tag that names none of our connections (or whose connection
// ended as it came), or a message through a TGT that is not its leg's; one
// for a reverse leg we announced and had not registered, past twice the
// window, or when that leg is registered through another TGT or never (the
// acceptor opened it by its own request, or the dial failed); a malformed
// frame (data too short for its number, a credit frame whose body is not 4
// bytes, a keepalive with a body, a FIN naming other tags, an unknown
// kind), and data after the peer's FIN. Duplicates and Overruns count
// theirs apart.
type Stats struct {
	Uplinks       int    // INI QPs, from their creation (a link being set up) until destroyed: one per remote node and domain, and those a recovery retired
	Downlinks     int    // TGT handles (one per remote sender, shared by its legs)
	LocalCounts   int    // receiving legs counted over the downlinks
	QPs           int    // Uplinks + Downlinks: the QPs this process holds
	Conns         int    // logical connections, including those being set up
	KernelHandles int    // every kernel handle and CM id the process holds (-1: unknown)
	Dropped       uint64 // received messages dropped: a failed receive, an unknown tag or wrong TGT, a malformed frame, ... (above)
	Rejected      uint64 // connection requests refused
	Recoveries    uint64 // recoveries of an uplink begun: its INI failed (an error, TGT_GONE, the peer's DREQ, a send queue that stayed full); counted as each begins, whether or not it rebuilds the uplink
	LegsMoved     uint64 // sending legs moved onto a rebuilt uplink
	VirtReqs      uint64 // SIDR exchanges this endpoint started (VIRT_REQs sent)
	OneExchange   uint64 // reverse legs set up inside the forward leg's exchange (either side)
	Abandoned     uint64 // inbound connections whose dialer's FIN came before its first frame (Accept never saw them); one given up before its forward leg was bound ends at the idle timeout, uncounted
	CreditFrames  uint64 // credit frames sent (flow control)
	Overruns      uint64 // connections failed because the peer sent past its credits
	Duplicates    uint64 // data messages received again (resent across a recovery) and dropped
	SendQueueFull uint64 // times a post found an INI's send queue full (ENOMEM) and waited for room
}

// Stats returns the endpoint's counts.
func (e *Endpoint) Stats() Stats {
	if !e.ok() {
		return Stats{}
	}
	e.mu.Lock()
	s := Stats{Conns: len(e.conns), KernelHandles: -1, Uplinks: e.iniSetup}
	for _, u := range e.uplinks {
		s.Uplinks += len(u.inis)
	}
	e.mu.Unlock()
	s.Downlinks = e.acc.Downlinks()
	s.LocalCounts = e.acc.LocalCounts()
	s.QPs = s.Uplinks + s.Downlinks
	if h, ok := e.k.(interface{ Handles() int }); ok {
		s.KernelHandles = h.Handles()
	}
	s.Dropped = e.dropped.Load()
	s.Rejected = e.rejected.Load()
	s.Recoveries = e.recoveries.Load()
	s.LegsMoved = e.moved.Load()
	s.VirtReqs = e.virtReqs.Load()
	s.OneExchange = e.oneExchange.Load()
	s.Abandoned = e.abandoned.Load()
	s.CreditFrames = e.creditSent.Load()
	s.Overruns = e.overruns.Load()
	s.Duplicates = e.duplicates.Load()
	s.SendQueueFull = e.sqFull.Load()
	return s
}

// newTagLocked returns a fresh non-zero tag for a leg we send on: none a
// live connection or a pending dial sends with (a random draw may hit one;
// the acceptor would take a request with it for that connection's), nor
// one released lately (see tagSource).
func (e *Endpoint) newTagLocked() uint32 {
	return e.tags.next(func(t uint32) bool { return e.pending[t] != nil || e.sendTags[t] != nil })
}

// setSendTagLocked makes t c's sending tag, booked to c until it finishes.
func (e *Endpoint) setSendTagLocked(c *Conn, t uint32) {
	if e.sendTags[c.sendTag] == c {
		delete(e.sendTags, c.sendTag)
		e.tags.release(c.sendTag)
	}
	c.sendTag = t
	e.sendTags[t] = c
}

// Dial opens a logical connection to the endpoint at address (ip:port) and
// returns once both legs are up.
//
// A receiver's registrations on a TGT can all go (and the TGT with them)
// while the sender's uplink over it is still up: the sender learns it at
// its next send or request there. The acceptor binds a reverse leg in its
// ACCEPT to its uplink here without a request of its own, so that leg can
// name a TGT that went after the acceptor looked (its other legs there
// closing meanwhile), its number perhaps taken again. Dial then abandons
// that attempt (a FIN ends the acceptor's half, which the acceptor's Accept
// never returns: there a connection whose reverse leg rode the ACCEPT is up
// at the dialer's first frame) and makes one more that asks for the
// reverse leg by its own exchange, whose request finds the TGT gone and
// makes the acceptor rebuild its uplink.
//
// Likewise for a reverse leg into another domain than ours: the acceptor
// learned our address's domain from a process that was here before us, in
// another domain (another DomainDir). Its reciprocal request in the second
// attempt names that domain, is refused DOMAIN_MISMATCH with ours, and so
// re-keys the address; asked once, the dial would fail for as long as the
// acceptor's uplink into the old domain lived.
func (e *Endpoint) Dial(ctx context.Context, address string) (*Conn, error) {
	if !e.ok() {
		return nil, ErrClosed
	}
	raddr, err := netip.ParseAddrPort(address)
	if err != nil {
		return nil, &OpError{"dial", address, fmt.Errorf("%w (%w)", err, ErrInvalid)}
	}
	raddr = canonicalAddr(raddr) // the form the CM reports the peer in
	// The dial makes kernel objects (an INI and its CM id, a SIDR id) on
	// this goroutine, and lets go of them here when it fails: Close, which
	// ends its exchanges (e.ctx, below), waits for it as for a goroutine
	// of its own, so that it returns with everything released.
	if !e.enter() {
		return nil, e.closedErr("dial")
	}
	defer e.wg.Done()
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, e.cfg.HandshakeTimeout)
		defer cancel()
	}
	// Close ends the dial too: its exchanges wait for the peer on ctx.
	caller := ctx
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	defer context.AfterFunc(e.ctx, func() { cancel(errEndpointEnded) })()
	c, err := e.dialOnce(ctx, raddr, false)
	if errors.Is(err, errReverseGone) || errors.Is(err, errReverseDomain) {
		switch {
		case ctx.Err() == nil:
			c, err = e.dialOnce(ctx, raddr, true)
		case caller.Err() != nil:
			// No time left to ask again: the deadline is what failed
			// the dial, not a refusal the caller cannot tell apart.
			err = &OpError{"dial", raddr.String(), caller.Err()}
		}
	}
	if err != nil && (e.ctx.Err() != nil || e.lostErr() != nil) &&
		(caller.Err() == nil || !errors.Is(err, caller.Err()) || context.Cause(ctx) == errEndpointEnded) {
		// The Dial's error is the endpoint's loss (lostErr). Only the
		// caller's own deadline or cancel stands: a kernel error that
		// came as the caller's context ended is still the endpoint's,
		// and so is the context error of a dial the endpoint's end
		// stopped before the caller's context ended too.
		return nil, e.closedErr("dial")
	}
	return c, err
}

func (e *Endpoint) dialOnce(ctx context.Context, raddr netip.AddrPort, twoExchanges bool) (*Conn, error) {
	address := raddr.String()
	e.mu.Lock()
	if e.closed || e.fatal != nil {
		e.mu.Unlock()
		return nil, e.closedErr("dial")
	}
	c := e.newConnLocked(raddr)
	c.twoExchanges = twoExchanges
	e.setSendTagLocked(c, e.newTagLocked())
	e.pending[c.sendTag] = c
	e.mu.Unlock()
	if err := e.openLeg(ctx, c, 0); err != nil {
		c.fail(err)
		return nil, dialErr(address, err)
	}
	if err := e.finishReverse(ctx, c); err != nil {
		return nil, dialErr(address, err)
	}
	select {
	case <-c.ready:
		return e.dialUp(ctx, c, address)
	case <-c.done:
		select {
		case <-c.ready:
			// Up, and already ended by an acceptor that sent and closed
			// at once: its messages, then io.EOF, are there to read.
			return c, nil
		default:
		}
		return nil, &OpError{"dial", address, c.errOr(ErrClosed)}
	case <-ctx.Done():
		select {
		case <-c.ready:
			return e.dialUp(ctx, c, address) // up as the deadline passed
		default:
		}
		// The acceptor may have taken the first frame already: the
		// FIN ends its half, which its Accept then never returns.
		return nil, &OpError{"dial", address, e.abortDial(c, ctx.Err())}
	}
}

// dialErr names a Dial's failure. A link exchange's own *OpError ("connect"
// to the same peer) gives its cause, so that the peer is named once.
func dialErr(address string, err error) error {
	if oe, ok := err.(*OpError); ok && oe.Op == "connect" {
		err = oe.Err
	}
	return &OpError{"dial", address, err}
}

// listenLoop answers the requests of one listener.
func (e *Endpoint) listenLoop(l kernel.ID) {
	for {
		ev, err := e.k.Event(e.ctx, l)
		if err != nil {
			if e.ctx.Err() == nil && (e.listening(l) || errors.Is(err, ErrDeviceRemoved)) {
				e.die(err)
			}
			// Else Close, or a die that destroyed l (unlisten): that
			// die's error, not l's EBADF, is the endpoint's. A
			// DEVICE_REMOVAL still dies, even on a destroyed l: it
			// closes the endpoint, and no other listener is left to
			// read it.
			return
		}
		if ev.Type == kernel.EventConnectRequest {
			e.onRequest(ev)
		}
	}
}

func (e *Endpoint) reject(ev kernel.Event, reason wire.RejectReason, tag uint32) {
	r := wire.Reject{Tag: tag, Reason: reason, MinVersion: wire.MinVersion, MaxVersion: wire.MaxVersion, DomainID: e.dom.ID}
	b := make([]byte, wire.BudgetSIDRREP)
	n, _ := r.Encode(b)
	e.rejected.Add(1)
	e.k.Reject(ev.ID, b[:n])
	e.k.DestroyID(ev.ID)
}

// onRequest runs the acceptor's decision on a PHYS_REQ or VIRT_REQ and
// binds an accepted leg to its connection.
func (e *Endpoint) onRequest(ev kernel.Event) {
	if tag, liar := e.srqLiarRequest(ev); liar {
		// Refused before the decision makes anything: our reverse leg
		// would name its bogus SRQ number, and fail our uplink again.
		e.reject(ev, wire.RejectBadRequest, tag)
		return
	}
	d := e.acc.Decide(ev)
	if d.Replaced != nil {
		e.mu.Lock()
		if c := e.recv[d.Replaced.Tag]; c != nil {
			e.unbindRecvLocked(c, d.Replaced)
		}
		e.mu.Unlock()
	}
	if f := e.testAfterDecide.Load(); f != nil {
		(*f)(d)
	}
	if d.UnknownMove && (e.readingAcceptFrom(ev.Remote.Addr()) || e.acc.Holds(d.moveKey)) {
		// Maybe the reverse leg of a dial of ours whose ACCEPT we have
		// not read yet, moved by its sender's recovery meanwhile: ask
		// it to come again (recover does, shortly). Or we read it since
		// Decide: takeReverse registers the leg before it takes the
		// dial off readingAcceptFrom's list, so a leg not on the list
		// is registered by now (unless released since, and then
		// refused rightly), and asked again the MOVE finds it.
		e.reject(ev, wire.RejectBusyRetry, d.Reject.Tag)
		return
	}
	if !d.Accept {
		if d.RefusedDial != 0 {
			// The dial fails before the refusal goes: refused, the
			// acceptor's half lets the forward leg go, perhaps the
			// last on its TGT, and a frame of the dial's posted
			// meanwhile found no TGT and recovered our uplink.
			e.reverseRefused(d, ev.Remote.Addr())
		}
		var fin <-chan struct{}
		if d.RefusedDial != 0 {
			// The refusal of a reciprocal request (here, not for the
			// dial's being given up: our CreateTGT failed, say), or the
			// answer to an ABORT, ends the acceptor's half.
			e.mu.Lock()
			fin = e.finToGoLocked(d.RefusedDial)
			e.mu.Unlock()
		}
		e.afterFIN(fin, func() {
			e.rejected.Add(1)
			e.k.Reject(ev.ID, d.PrivateData)
			e.k.DestroyID(ev.ID)
		})
		return
	}
	phys := ev.Exchange == kernel.ExchangeXRC
	if d.Duplicate || d.Moved {
		err := e.k.Accept(ev.ID, d.QPNum, d.PrivateData)
		if d.Moved && !d.stayed && !d.again {
			// Not a MOVE onto the leg's own TGT: taken again and again
			// (it leaves the generation as it was), a replay of one
			// kept a dead sender's leg for ever (TestNoOpMoveIsNoSignOfLife).
			// Nor a PHYS_REQ MOVE of the leg's generation, taken again
			// and again too, each copy onto a new TGT: its first copy
			// was the word (TestSameGenPhysMoveIsNoSignOfLife).
			// Whether or not our answer went: its sender, not answered,
			// asks again so (TestMoveAskedAgainAfterFailedAnswerKeepsLeg).
			e.legMoved(d.Leg)
		}
		if err != nil || !phys {
			e.k.DestroyID(ev.ID)
		}
		if err == nil && phys {
			e.watchPassive(ev.ID, d.Downlink, nil, nil)
		}
		return
	}
	leg := d.Leg
	e.mu.Lock()
	var c *Conn
	if leg.Reciprocal != 0 {
		// The reverse leg of one of our dials: it must name a dial of
		// ours still waiting, to the node it comes from. Not one given
		// up (at its deadline, or by Close), whose FIN may still be on
		// its way: accepted, the leg would complete the dial, and the
		// acceptor's Accept would return it.
		if c = e.reverseDialLocked(leg.Reciprocal, ev.Remote.Addr(), leg.PeerIncarnation); c == nil {
			fin := e.finToGoLocked(leg.Reciprocal)
			e.mu.Unlock()
			e.afterFIN(fin, func() {
				e.acc.Withdraw(leg)
				e.reject(ev, wire.RejectBadRequest, leg.PeerTag)
			})
			return
		}
	} else {
		if e.closed || e.dying || e.fatal != nil || len(e.conns) >= 1<<20 || e.unaccepted >= acceptBacklog {
			e.mu.Unlock()
			e.acc.Withdraw(leg)
			e.reject(ev, wire.RejectBusyRetry, leg.PeerTag)
			return
		}
		c = e.newConnLocked(netip.AddrPortFrom(ev.Remote.Addr(), leg.ReplyPort))
		// Up only at the dialer's first frame, whichever way its
		// reverse leg goes (see consumeLocked).
		c.inbound, c.awaitFirst = true, true
		c.peerInc = leg.PeerIncarnation
		c.unaccepted = true
		e.unaccepted++
	}
	c.recvLeg, c.recvTag, c.lastSeen = leg, leg.Tag, time.Now()
	e.recv[leg.Tag] = c
	pd := d.PrivateData
	reverse := false // the ACCEPT carries the reverse leg
	if !phys && leg.RevTag != 0 {
		var b []byte
		if b, reverse = e.bindReverseLocked(c, leg); reverse {
			pd = b
		}
	}
	e.mu.Unlock()
	if err := e.k.Accept(ev.ID, d.QPNum, pd); err != nil {
		e.k.DestroyID(ev.ID)
		c.fail(err)
		return
	}
	if reverse {
		e.oneExchange.Add(1) // once the ACCEPT went: not for one the kernel failed
	}
	if phys {
		e.watchPassive(ev.ID, d.Downlink, c, leg)
		return
	}
	e.k.DestroyID(ev.ID)
	e.recvLegUp(c)
}

// reverseDialLocked returns the dial of ours that a request for a reverse
// leg names (tag, the request's peer tag), from node by incarnation inc:
// one still waiting for its reverse leg, to that node. Not one given up
// (at its deadline, or by Close), whose FIN may still be on its way. One
// whose ACCEPT came from another incarnation cannot complete: it fails
// now, as checkReadyLocked fails it where the request comes first, not
// at its deadline.
func (e *Endpoint) reverseDialLocked(tag uint32, node netip.Addr, inc uint64) *Conn {
	c := e.pending[tag]
	if c == nil || c.recvLeg != nil || c.abandoned || e.closed || !sameNode(c.raddr.Addr(), node) {
		return nil
	}
	if c.peerInc != 0 && c.peerInc != inc {
		c.failLocked(errIncarnation)
		return nil
	}
	return c
}

// finToGoLocked returns, for a dial of ours given up (tag) whose FIN is
// still to go, what closes once it has gone (the dial's end); else nil. A
// refusal of its reverse leg, or the answer to its ABORT, ends the
// acceptor's half, which lets the forward leg go, perhaps the last on its
// TGT, and the FIN would find no TGT and fail our uplink: they wait for it.
func (e *Endpoint) finToGoLocked(tag uint32) <-chan struct{} {
	if p := e.pending[tag]; p != nil && p.abandoned && p.sendUp && !p.sendDone {
		return p.done
	}
	return nil
}

// afterFIN runs f once fin (from finToGoLocked) is closed, or the endpoint
// closes, on a goroutine of the endpoint's; at once if fin is nil.
func (e *Endpoint) afterFIN(fin <-chan struct{}, f func()) {
	if fin == nil || !e.spawn(func() {
		select {
		case <-fin:
		case <-e.ctx.Done():
		}
		f()
	}) {
		f()
	}
}

// reverseRefused fails the dial of ours whose reverse leg we have just
// refused (d), unless the acceptor asks again: it does after TGT_GONE
// (rebuilding its uplink) and DOMAIN_MISMATCH (learning our domain), and
// its half fails on any other refusal. Until then the dial heard nothing,
// and waited to its deadline (TestDialReverseLegRefusedFailsAtOnce). As a
// taken leg does, only a request from the dialed node naming the dial
// decides its fate. No FIN: the acceptor's half ends with its refused
// request (else, never up, at its idle timeout).
func (e *Endpoint) reverseRefused(d decision, from netip.Addr) {
	r := d.Reject
	if r.Reason == wire.RejectTGTGone || r.Reason == wire.RejectDomainMismatch {
		return
	}
	err := fmt.Errorf("%w: %v", errReverseRefused, r.Reason)
	switch {
	case d.Aborted:
		err = errReverseAborted
	case r.Reason == wire.RejectBusyRetry && d.kernelErr != nil: // our kernel's failure (acceptor.physical)
		err = fmt.Errorf("%w: %v: %w", errReverseRefused, r.Reason, d.kernelErr)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if c := e.reverseDialLocked(d.RefusedDial, from, d.refusedInc); c != nil {
		c.failLocked(err)
	} else if d.Aborted {
		e.abortTakenLocked(d, from)
	}
}

// abortTakenLocked fails the connection of ours whose reverse leg an ABORT
// (d) names: we took the leg, but our answer was lost, and the acceptor's
// half fails with its request. Until a review found it the ABORT was
// refused as a stray one, and Dial returned a connection that heard
// nothing until its idle timeout (TestDialReverseAnswerLostAborts).
func (e *Endpoint) abortTakenLocked(d decision, from netip.Addr) {
	c := e.sendTags[d.RefusedDial]
	if c == nil || c.inbound || c.recvLeg == nil || c.recvReleased || !sameNode(c.raddr.Addr(), from) {
		return
	}
	if l := c.recvLeg; l.Reciprocal == d.RefusedDial && l.PeerTag == d.Reject.Tag && l.PeerIncarnation == d.refusedInc {
		c.failLocked(errReverseAborted)
	}
}

// readingAcceptFrom reports whether a dial of ours to node announced a
// reverse leg (FlagOneExchange) that is not registered yet.
func (e *Endpoint) readingAcceptFrom(node netip.Addr) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, c := range e.pending {
		if !c.inbound && c.earlyTag != 0 && c.recvLeg == nil && sameNode(c.raddr.Addr(), node) {
			return true
		}
	}
	return false
}

// bindReverseLocked answers a VIRT_REQ flagged FlagOneExchange with the
// reverse leg in the ACCEPT when we have a live uplink to the requester's
// node: c's sending leg rides that uplink at once, to the receive tag the
// requester announced, and the requester registers it itself. Without a
// live uplink into the requester's own domain (or if the section does not
// fit) it returns false and the reverse leg goes the old way, a reciprocal
// VIRT_REQ (or PHYS_REQ). The domain must be known: a requester's node may
// hold several domains, the request does not say which is the requester's,
// and a reverse leg into another domain costs the dial an attempt (the
// requester refuses it and asks again by two exchanges). The old way
// learns the domain for the next dial, and corrects one learned from an
// earlier process at that address (DOMAIN_MISMATCH).
func (e *Endpoint) bindReverseLocked(c *Conn, leg *acceptedLeg) ([]byte, bool) {
	u := e.uplinkForLocked(c.raddr)
	if e.closed || u == nil || u.state != upUp || u.cur == nil || u.dom == 0 || u.dom != e.domainOfLocked(c.raddr) || !u.hasOpenLeg() {
		return nil, false
	}
	tag := e.newTagLocked()
	rev := wire.Reverse{Tag: tag, INIQPN: u.cur.num, TGTQPN: u.cur.tgt, DomainID: u.dom}
	b, ok := e.acc.AddReverse(leg, rev)
	if !ok {
		return nil, false
	}
	e.setSendTagLocked(c, tag)
	c.up, c.holdsRef = u, true
	u.refs++
	u.legs[c] = struct{}{}
	c.peerTag, c.peerSRQN, c.peerInc = leg.RevTag, leg.PeerSRQN, leg.PeerIncarnation
	c.sendWindow, c.sendMax = uint32(leg.PeerCredits), int(leg.PeerMaxMessage)
	c.sendUp, c.lastSent = true, time.Now()
	return b, true
}

// takeReverse registers the reverse leg that the forward ACCEPT acc
// carries (verifying the acceptor's TGT as the acceptor would for a
// VIRT_REQ), or notes in c why it cannot: finishReverse fails the dial then.
func (e *Endpoint) takeReverse(c *Conn, acc *wire.Accept) {
	e.mu.Lock()
	tag := c.earlyTag
	if c.failed() || c.recvLeg != nil || tag == 0 {
		if !c.failed() { // a section we did not ask for, or beside a reciprocal leg: not ours to choose
			c.revErr = errBadReverse
		}
		e.mu.Unlock()
		return
	}
	// Until ReverseLeg answers, tag stays reserved: a failure meanwhile
	// (dropEarlyLocked) leaves it to us, else the tag, given back and
	// drawn again for another dial, would be registered here too.
	c.revInFlight = true
	e.mu.Unlock()
	if f := e.testBeforeReverseLeg.Load(); f != nil {
		(*f)(c, tag)
	}
	leg, err := e.acc.ReverseLeg(tag, c.sendTag, acc, c.raddr.Addr(), c.raddr.Port())
	e.mu.Lock()
	defer e.mu.Unlock()
	c.revInFlight = false
	if err != nil {
		c.revErr = err
		if c.earlyTag != tag { // dropped meanwhile: ours to give back
			e.acc.Unreserve(tag)
		}
		return
	}
	if c.failed() || c.recvLeg != nil {
		e.acc.Release(leg)
		return
	}
	c.recvLeg, c.recvTag, c.recvUp, c.lastSeen = leg, tag, true, time.Now()
	c.revTaken, c.firstDue = true, true
	early := c.early
	c.early, c.earlyTag = nil, 0
	for _, m := range early {
		if !e.acc.LegAccepts(leg, m.tgt) || e.recv[tag] != c {
			e.dropped.Add(1)
			continue
		}
		if !e.consumeLocked(c, leg, m.payload) {
			kernel.FreePayload(m.payload)
		}
	}
	e.oneExchange.Add(1)
}

// finishReverse ends a dial whose forward leg is up. If the ACCEPT carried
// the reverse leg, takeReverse registered it; if it did not, the reverse
// leg comes as a reciprocal VIRT_REQ and the tag we announced is
// forgotten. A reverse leg that failed verification fails the dial
// cleanly: a FIN on the forward leg ends the acceptor's half, and nothing
// of it stays registered here; the error says why, and the dial ends with
// it. So does a dial whose context ends before its first frame is posted.
func (e *Endpoint) finishReverse(ctx context.Context, c *Conn) error {
	e.mu.Lock()
	took, err, up := c.revTaken, c.revErr, c.isReady
	if !took {
		e.dropEarlyLocked(c)
		// The reciprocal leg comes later, and our first frame once it
		// is up (dialUp): until then the dial may still fail (its
		// deadline passing as we answer that request), and after a
		// first frame its FIN would be a close to the acceptor's half,
		// which that leg's ACCEPT or RTU then completes. The post below
		// sends a keepalive as a credit frame (see Conn.post): it finds
		// an acceptor that died meanwhile.
		c.firstHeld = true
	}
	e.mu.Unlock()
	if err != nil {
		return e.abortDial(c, err)
	}
	if !took && up {
		return nil // its reciprocal leg came first: dialUp sends the first frame at once
	}
	// Our first frame on the forward leg (here, if the reverse leg is
	// still to come, its stand-in) completes the acceptor's half (see
	// consumeLocked), whichever way the reverse leg goes: a dial
	// that gives up before its leg is bound sends nothing, and the
	// acceptor's half never comes up, though its reciprocal leg may
	// have been taken. A lost first frame is made up for by the next, a
	// keepalive at the latest. So a full send queue is waited out rather
	// than taken for a loss: the acceptor's Accept would wait a
	// heartbeat for the next one. The wait honours the dial's context
	// (an INI stalled behind a receiver that stopped draining its SRQ
	// frees no room: rnr_retry 7 retries for ever); given up, the dial
	// ends as above, with a FIN that goes once there is room, as the
	// acceptor's half's first frame.
	if !e.postFirstFrame(ctx, c) && ctx.Err() != nil {
		return e.abortFirst(c, ctx.Err())
	}
	return nil
}

// dialUp returns the dial c, now up both ways. One whose reverse leg came
// by the acceptor's reciprocal request sends its first frame now (see
// finishReverse); given up before it is posted, the dial's FIN is the
// first frame, as in finishReverse.
func (e *Endpoint) dialUp(ctx context.Context, c *Conn, address string) (*Conn, error) {
	e.mu.Lock()
	held := c.firstHeld
	c.firstHeld = false
	c.firstDue = c.firstDue || held
	e.mu.Unlock()
	if held && !e.postFirstFrame(ctx, c) && ctx.Err() != nil {
		if err := e.abortFirst(c, ctx.Err()); err != nil {
			return nil, &OpError{"dial", address, err}
		}
	}
	return c, nil
}

// abortFirst is abortDial for a dial whose context ended before its own
// first frame was posted, and returns nil, giving up nothing, where a
// keepalive went first meanwhile (a recovery's resend, firstDue, or the
// janitor's): that completed the acceptor's half, and a FIN after it would
// close a connection Accept returns while Dial failed
// (TestDialUpKeepaliveByRecoveryCommitsTheDial). The dial is up then, as
// one up as its context ends (dialOnce).
func (e *Endpoint) abortFirst(c *Conn, err error) error {
	e.mu.Lock()
	sent := c.keepalives > 0
	if !sent {
		c.firstDue, c.abandoned = false, true // from here no keepalive goes (post, resend)
	}
	e.mu.Unlock()
	if sent {
		return nil
	}
	return e.abortDial(c, err)
}

// postFirstFrame posts c's first frame on its forward leg, waiting for
// room in a full send queue, and reports whether it did.
func (e *Endpoint) postFirstFrame(ctx context.Context, c *Conn) bool {
	// wait waits for ch, and reports false where the connection, the
	// endpoint or the dial ended first.
	wait := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		case <-c.done:
		case <-e.ctx.Done():
		case <-ctx.Done():
		}
		return false
	}
	for try := 0; try < maxTries; try++ {
		res, room, _ := c.post(kindHeartbeat, nil, nil)
		switch res {
		case posted:
			return true
		case postFull:
			if !wait(room) {
				return false
			}
		case postFailed:
			// The uplink is recovering (or the leg is gone): wait for
			// it, as sendFrame does, rather than spend every try at once.
			e.mu.Lock()
			u := c.up
			var ch <-chan struct{}
			again := false
			if u != nil && u.state != upNone && c.err == nil {
				if u.state == upUp && !c.unmoved {
					// Recovered since the post failed (or the INI it
					// went to was replaced meanwhile): try again.
					again = true
				} else {
					ch = u.changed
				}
			}
			e.mu.Unlock()
			if again {
				continue
			}
			if ch == nil || !wait(ch) {
				return false
			}
			try--
		}
	}
	return false
}

// dropEarlyLocked forgets the receive tag c announced for a reverse leg
// that will not be registered, and what arrived for it.
func (e *Endpoint) dropEarlyLocked(c *Conn) {
	if c.earlyTag == 0 {
		return
	}
	if e.recv[c.earlyTag] == c && c.recvTag != c.earlyTag {
		delete(e.recv, c.earlyTag)
	}
	if c.recvTag != c.earlyTag && !c.revInFlight { // else takeReverse gives it back
		e.acc.Unreserve(c.earlyTag)
	}
	e.dropped.Add(uint64(len(c.early)))
	c.early, c.earlyTag = nil, 0
}

// abortDial ends a dial whose reverse leg cannot be made and returns err,
// the dial's error. A FIN on the forward leg ends the acceptor's half; it
// goes in the background, since the uplink under it may be recovering, and
// while it does a refused MOVE may fail c with another error: the dial's
// error is err all the same (Dial asks again after errReverseGone and
// errReverseDomain).
func (e *Endpoint) abortDial(c *Conn, err error) error {
	e.mu.Lock()
	fin := c.sendUp && !c.sendDone && c.err == nil
	c.firstDue, c.abandoned = false, true // the FIN is to be the first frame
	e.mu.Unlock()
	if !fin || !e.spawn(func() {
		ctx, cancel := context.WithTimeout(e.ctx, e.cfg.HandshakeTimeout)
		defer cancel()
		c.sendFIN(ctx, false)
		c.fail(err)
	}) {
		c.fail(err)
	}
	return err
}

// watchPassive follows a physical link we accepted (we created the TGT):
// RTU, then the DREQ that says the sender's INI is gone. A sender that
// takes the CONNECT_RESPONSE and never sends the RTU would hold the TGT,
// its count and the connection for ever (the kernel CM waited over 40 s on
// rxe, facts.md): without the RTU within the handshake timeout, or with the
// CM's word that the reply went unanswered, the link ends. dl is the
// downlink the link made: its DREQ ends the legs still on it.
func (e *Endpoint) watchPassive(id kernel.ID, dl *downlink, c *Conn, leg *acceptedLeg) {
	live, end := context.WithCancel(e.ctx)
	e.mu.Lock()
	e.passive[id] = &passiveLink{dl: dl, end: end}
	e.mu.Unlock()
	e.spawn(func() {
		defer func() {
			end()
			e.mu.Lock()
			_, mine := e.passive[id]
			delete(e.passive, id)
			e.mu.Unlock()
			if mine {
				e.k.DestroyID(id)
			}
		}()
		rtu, cancel := context.WithTimeout(live, e.cfg.HandshakeTimeout)
		defer cancel()
		wait := rtu
		for {
			ev, err := e.k.Event(wait, id)
			if err != nil {
				switch {
				case live.Err() != nil: // ended by us (linger, Close)
				case wait == rtu && rtu.Err() != nil: // no RTU in time
					if c != nil {
						c.fail(errNoRTU)
					}
				default:
					// The id failed, not the wait: the device's
					// removal (DEVICE_REMOVAL reaches every id on it)
					// or the kernel's failure, the endpoint's end, as
					// where a listener's id reads it (listenLoop),
					// whichever reads it first. Taken for a missing
					// RTU, it failed the link's connection as its
					// peer's (TestDeviceRemovalOnPassiveLinkFirst).
					e.die(err)
				}
				return
			}
			switch ev.Type {
			case kernel.EventEstablished:
				wait = live
				e.mu.Lock()
				if l := e.passive[id]; l != nil {
					l.up = true
				}
				e.mu.Unlock()
				if c != nil {
					e.recvLegUp(c)
				}
			case kernel.EventUnreachable:
				if wait != rtu {
					continue
				}
				if c != nil { // the REP went unanswered
					c.fail(errNoRTU)
				}
				return
			case kernel.EventRejected:
				if c == nil {
					return
				}
				if ev.Status == kernel.RejStaleConn {
					// Our REP named a TGT number the sender's node still
					// had in its stale table: its CM sends the REQ
					// again, which is decided anew. Released and unbound
					// under mu: onRequest binds the REQ's leg under mu
					// too, so it never finds this one still bound.
					e.mu.Lock()
					e.acc.Release(leg)
					e.unbindRecvLocked(c, leg)
					e.mu.Unlock()
				} else { // the sender gave up
					c.fail(errStaleLink)
				}
				return
			case kernel.EventDisconnected:
				// The sender's INI is gone (closed, crashed, or replaced).
				// Its legs through this TGT end, after a grace period in
				// which a FIN still in our SRQ can end them gracefully.
				e.k.Disconnect(id)
				e.senderGone(dl)
			case kernel.EventTimewaitExit:
				return
			}
		}
	})
}

// passiveLink is a physical link we accepted: dl is the downlink it made,
// end ends its watcher, which then destroys its CM id. up: its RTU came;
// bare: since when no leg is on it (zero: one is, or not looked at yet).
type passiveLink struct {
	dl   *downlink
	end  context.CancelFunc
	up   bool
	bare time.Time
}

// lingerLocked ends the established physical links that had no leg on them
// for an idle timeout. Their sender is silent to us as an idle leg's is:
// it may live, and send its next leg through the link, or be dead without
// a word (its node's power cut after its legs ended by FIN or idle
// timeout), and then no DREQ ever ends the link: its CM id stayed until the
// endpoint closed. Ending a live sender's link disturbs nothing (a
// TGT-typed id's end sends nothing, and legs do not need the link); its
// later legs lose only the DREQ's early word of the sender's death, and end
// at their idle timeout instead.
func (e *Endpoint) lingerLocked(now time.Time) {
	if len(e.passive) == 0 {
		return
	}
	linger := cmp.Or(e.cfg.linkLinger, e.cfg.IdleTimeout)
	links := make([]*passiveLink, 0, len(e.passive))
	dls := make([]*downlink, 0, len(e.passive))
	for _, l := range e.passive {
		if l.up {
			links, dls = append(links, l), append(dls, l.dl)
		}
	}
	inUse := linksInUse(dls, e.acc.LegDownlinks())
	for i, l := range links {
		switch {
		case inUse[i]:
			l.bare = time.Time{}
		case l.bare.IsZero():
			l.bare = now
		case now.Sub(l.bare) > linger:
			l.end()
		}
	}
}

// legLeftLocked restarts the linger of the physical link that l, a leg
// about to be released, receives through. The janitor's looks, a quarter
// idle timeout apart, miss a leg that came and went between two of them:
// the link ended at the next look, just after its last leg, not an idle
// timeout after.
func (e *Endpoint) legLeftLocked(l *acceptedLeg) {
	if len(e.passive) == 0 {
		return
	}
	dl := e.acc.LegDownlink(l)
	for _, p := range e.passive {
		if onLink(dl, p.dl) {
			p.bare = time.Time{}
		}
	}
}

// legFailedLocked ends the physical link of dl's sender once the failure of
// a leg through dl for its sender's death (senderDead) leaves none
// through it: the sender is taken for dead. A link whose legs all ended by
// their FINs, or by the sender's silence (past the idle timeout, or a MOVE
// of ours it did not answer, as a sender that died without a word, its
// node's power cut, leaves them: no DREQ comes from it), lingers
// (lingerLocked): its sender may live, and open the TGT again through it
// (LegsOn), or end it with its DREQ (TestEndpointDREQSparesReusedNumbers).
// Ending a TGT-typed id sends nothing: a live sender is not disturbed.
func (e *Endpoint) legFailedLocked(dl *downlink) {
	for _, l := range e.passive {
		if onLink(dl, l.dl) && len(e.acc.LegsOn(l.dl)) == 0 {
			l.end()
		}
	}
}

// unbindRecvLocked takes leg, released, off c if c still receives on it
// (it was not up yet): a dial of ours waits for the leg's next request, an
// inbound connection, which Accept has not seen, ends.
func (e *Endpoint) unbindRecvLocked(c *Conn, leg *acceptedLeg) {
	if c.recvLeg != leg || c.recvReleased {
		return
	}
	if c.inbound {
		c.failLocked(errStaleLink) // its release of leg finds it released
		return
	}
	if e.recv[leg.Tag] == c {
		delete(e.recv, leg.Tag)
	}
	c.recvLeg, c.recvTag = nil, 0
}

// senderGone marks the connections receiving through dl as their sender's
// INI gone (the janitor ends them once their FIN cannot still be queued).
func (e *Endpoint) senderGone(dl *downlink) {
	now := time.Now()
	// The legs are read under mu: a MOVE that took a leg off this TGT
	// either came first (the leg is not listed) or clears goneAt after us.
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, l := range e.acc.LegsOn(dl) {
		// Also over the mark of a link the leg has left, whose MOVE's
		// legMoved is still to come: this one is the leg's now
		// (TestDREQOfLinkMovedOntoEndsLeg).
		if c := e.recv[l.Tag]; c != nil && (c.goneAt.IsZero() || c.goneLink != nil && !onLink(e.acc.LegDownlink(l), c.goneLink)) {
			c.goneAt, c.goneDrains, c.goneLink = now, e.polls.Load(), dl
		}
	}
}

// legMoved notes that the sender of leg l moved it onto a new TGT: the
// sender lives, so an end of the old physical link read before the MOVE (a
// DREQ the CM sent, or one from a sender that disconnects before it moves)
// no longer ends the leg, and its silence counts from the MOVE, as from a
// frame: it sent nothing while its recovery moved legs, perhaps for a
// budget spent on another receiver first (TestMovedLegRestartsIdleClock).
func (e *Endpoint) legMoved(l *acceptedLeg) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if c := e.recv[l.Tag]; c != nil && c.recvLeg == l {
		// Not the mark of the link the leg is on: its DREQ, read since
		// the MOVE was decided, says the sender is gone after it
		// (TestDREQOfLinkMovedOntoEndsLeg).
		if c.goneLink == nil || !onLink(e.acc.LegDownlink(l), c.goneLink) {
			c.goneAt, c.goneLink = time.Time{}, nil
		}
		c.lastSeen = time.Now()
	}
}

// recvLegUp marks the receiving leg of c up; an inbound connection then
// opens its reverse leg.
func (e *Endpoint) recvLegUp(c *Conn) {
	e.mu.Lock()
	if c.recvUp || c.failed() {
		e.mu.Unlock()
		return
	}
	c.recvUp = true
	c.lastSeen = time.Now()
	inbound := c.inbound && !c.sendUp // else the reverse leg rode the ACCEPT
	c.checkReadyLocked()
	e.mu.Unlock()
	if inbound {
		e.spawn(func() {
			ctx, cancel := context.WithTimeout(e.ctx, e.cfg.HandshakeTimeout)
			defer cancel()
			e.mu.Lock()
			if c.finished {
				// It failed since, unbooking no tag: one booked now
				// would stay in sendTags until Close.
				e.mu.Unlock()
				return
			}
			e.setSendTagLocked(c, e.newTagLocked())
			e.mu.Unlock()
			peer := c.recvLeg.PeerTag
			if err := e.openLeg(ctx, c, peer); err != nil {
				// Never to reach Accept: its place in the
				// backlog goes now, not once the ABORT below is
				// answered (TestReverseAbortGivesBacklogSlotBack).
				e.mu.Lock()
				c.acceptedLocked()
				told := c.revFIN // the dialer took the leg: the FIN on it tells it
				e.mu.Unlock()
				var rj *RejectError
				if !told && (!errors.As(err, &rj) || rj.Reason == RejectTGTGone || rj.Reason == RejectDomainMismatch ||
					rj.Reason == RejectCM) {
					// Else the dialer refused it, and that failed
					// the dial there (reverseRefused): an ABORT could
					// overtake its refusal's own failure of the dial.
					// A CM's refusal or timeout (RejectCM) is none
					// of the dialer's: it never saw the request, or
					// took the leg and its answer was lost
					// (abortTakenLocked).
					// Before our half fails: that lets the forward
					// leg go, perhaps the last on its TGT, and a
					// frame of the dialer's then found no TGT and
					// recovered its uplink, failing the dial first.
					e.abortReverse(c, peer)
				}
				c.fail(err)
			}
		})
	}
}

// abortReverse tells the dialer of c, an inbound connection whose reverse
// leg (for the dialer's forward leg peer) failed to open, that it will not
// come: an ABORT, so that the Dial fails now, not at its deadline. Best
// effort, within the handshake timeout: a dialer that does not hear it
// still fails at its deadline. Not while the endpoint closes: the dialer's
// frames then find our SRQ gone. A dial already failed or given up answers
// it as any stray request.
func (e *Endpoint) abortReverse(c *Conn, peer uint32) {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return
	}
	req := e.req(c, wire.TypeVirtReq, peer)
	e.mu.Unlock()
	req.Flags |= wire.FlagAbort
	ctx, cancel := context.WithTimeout(e.ctx, e.cfg.HandshakeTimeout)
	defer cancel()
	e.virtLink(ctx, c.raddr, &req) // answered REJECT(BAD_REQUEST) either way
}

// recvLoop takes every message from the SRQ and hands it to its connection,
// dropping messages whose tag names no live connection or that came through
// a TGT that is not its sender's (misdelivery after SRQ-number reuse).
func (e *Endpoint) recvLoop() {
	var wcs [32]kernel.RecvCompletion
	for {
		seq := e.polls.Add(1)
		base, ctx, cancel := e.pollCtx()
		n, err := e.k.PollRecv(ctx, e.srq, wcs[:])
		if cancel != nil {
			cancel()
		}
		if err != nil && n == 0 && e.ctx.Err() == nil && ctx.Err() != nil {
			if base.Err() != nil || errors.Is(err, syscall.EINTR) {
				continue // kicked (this poll began before what asked for a drain), or the SRQ not empty
			}
			n, err = 0, nil // a poll with a deadline that found the SRQ empty
		}
		// Messages may come with an error (the real kernel's repost of
		// their slots failed): received all the same, they are
		// delivered (or dropped and counted) as any, before the error
		// ends the endpoint.
		for i := range wcs[:n] {
			if !e.deliver(&wcs[i]) {
				kernel.FreePayload(wcs[i].Payload)
			}
			wcs[i] = kernel.RecvCompletion{}
		}
		if err != nil {
			if e.ctx.Err() == nil {
				e.die(err)
			}
			return
		}
		if n < len(wcs) {
			e.drains.Store(seq)
			e.acc.Reap()
			if e.goneSenders.Load() > 0 {
				e.endGoneSenders(seq)
			}
		}
	}
}

// In-band frame kinds: the first byte of every message.
const (
	kindData      = 'D'
	kindFIN       = 'F'
	kindHeartbeat = 'H'
	kindCredit    = 'C' // followed by creditLen bytes: see Conn.returnCredits
)

// dataSeqLen is the sequence number after a data frame's kind byte: a
// uint32 counting the leg's data messages from 0, wrapping (see
// replayWindow).
const dataSeqLen = 4

// frameSize is the SRQ slot that holds a data frame of a message of up to
// maxMessage bytes (MinMessageSize and up: internal frames are smaller).
func frameSize(maxMessage int) int { return 1 + dataSeqLen + maxMessage }

// deliver hands one message to its connection; it reports whether the
// payload was kept (queued), else the caller gives it back.
func (e *Endpoint) deliver(wc *kernel.RecvCompletion) bool {
	if wc.Status != verbs.WCSuccess || len(wc.Payload) == 0 {
		e.dropped.Add(1)
		return false
	}
	e.mu.Lock()
	c := e.recv[wc.Imm]
	var leg *acceptedLeg
	if c != nil && c.recvTag != wc.Imm {
		// A reverse leg we announced, not registered yet: its ACCEPT may
		// still be on its way while the acceptor already sends. Kept
		// (bounded) until finishReverse checks and consumes them.
		kept := c.earlyTag == wc.Imm && len(c.early) < maxQueued(e.cfg.RecvWindow)
		if kept {
			c.early = append(c.early, earlyMsg{tgt: wc.TGTQPN, payload: wc.Payload})
		} else {
			e.dropped.Add(1)
		}
		e.mu.Unlock()
		return kept
	}
	if c != nil {
		leg = c.recvLeg
	}
	e.mu.Unlock()
	if c == nil || !e.acc.LegAccepts(leg, wc.TGTQPN) {
		e.dropped.Add(1)
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.recv[wc.Imm] != c {
		e.dropped.Add(1)
		return false
	}
	return e.consumeLocked(c, leg, wc.Payload)
}

// lingerPoll bounds a receive poll while the acceptor keeps a TGT handle
// for messages that may still be queued (acceptor.maybeDropLocked): an idle
// SRQ then still drains, and the handle goes.
const lingerPoll = 5 * time.Millisecond

// pollCtx returns the context of the receive loop's next poll and the base
// it derives from: the base alone, which only Close and kickPoll end, or,
// while the acceptor keeps a TGT handle until the next drain, the base with
// a deadline (cancel releases it). A poll that begins with a live context
// looks at the SRQ before it waits, so one that reaches its deadline found
// the SRQ empty.
func (e *Endpoint) pollCtx() (base, ctx context.Context, cancel context.CancelFunc) {
	e.pollMu.Lock()
	if e.pollBase == nil || e.pollBase.Err() != nil {
		e.pollBase, e.pollStop = context.WithCancel(e.ctx)
	}
	base = e.pollBase
	e.pollMu.Unlock()
	if !e.acc.Lingering() && e.goneSenders.Load() == 0 {
		return base, base, nil
	}
	ctx, cancel = context.WithTimeout(base, lingerPoll)
	return base, ctx, cancel
}

// endGoneSenders fails the connections whose sending leg ended with its
// receiver's endpoint gone (sendGone) once poll seq, begun after that, has
// found the SRQ empty: the peer's FIN, had it sent one, would have ended
// them by now.
func (e *Endpoint) endGoneSenders(seq uint64) {
	var gone []*Conn
	waiting := int32(0)
	e.mu.Lock()
	for c := range e.conns {
		switch {
		case c.sendGone == nil || c.failed():
		case c.goneDrains < seq:
			gone = append(gone, c)
		default:
			waiting++
		}
	}
	e.goneSenders.Store(waiting)
	e.mu.Unlock()
	for _, c := range gone {
		c.fail(c.sendGone)
	}
}

// kickPoll ends the receive loop's poll under way, which may wait for ever
// on an idle SRQ: the next one has a deadline (see pollCtx).
func (e *Endpoint) kickPoll() {
	e.pollMu.Lock()
	if e.pollStop != nil {
		e.pollStop()
	}
	e.pollMu.Unlock()
}

type earlyMsg struct {
	tgt     uint32
	payload []byte
}

// consumeLocked takes one message of c's receiving leg leg (tag and TGT
// already checked). It reports whether it kept p (a data message, queued
// for Recv); the caller gives back any other.
//
// An inbound connection is up only once its dialer's first frame comes (a
// keepalive it sends once its reverse leg is up): the dialer may yet
// abandon the attempt (see Dial), and then its first frame is a FIN. Such a
// connection ends here, never seen by Accept. A credit frame is no first
// frame: a dial waiting for our reciprocal request's answer sends its
// keepalives so (Conn.firstHeld). Once that leg is up here, they no
// longer count as signs of life: the first frame is due.
func (e *Endpoint) consumeLocked(c *Conn, leg *acceptedLeg, p []byte) bool {
	if !c.awaitFirst {
		return e.consumeFrameLocked(c, leg, p)
	}
	if p[0] == kindCredit {
		seen := c.lastSeen
		kept := e.consumeFrameLocked(c, leg, p)
		if c.sendUp {
			c.lastSeen = seen
		}
		return kept
	}
	c.awaitFirst = false
	var f wire.FIN
	if p[0] == kindFIN && wire.DecodeFIN(p[1:], &f) == nil && !f.Half && f.Tag == c.recvTag && f.SenderTag == leg.PeerTag {
		e.abandoned.Add(1)
		c.failLocked(errAbandoned)
		return false
	}
	kept := e.consumeFrameLocked(c, leg, p)
	c.checkReadyLocked()
	return kept
}

func (e *Endpoint) consumeFrameLocked(c *Conn, leg *acceptedLeg, p []byte) bool {
	body := p[1:]
	c.lastSeen = time.Now()
	switch p[0] {
	case kindData:
		if len(body) < dataSeqLen || c.finRcvd {
			// Short, or after the peer's FIN (a half-close keeps the leg).
			e.dropped.Add(1)
			return false
		}
		if c.seen.bits == nil {
			c.seen = newReplayWindow(e.cfg.RecvWindow)
		}
		if c.q.Cap() == 0 {
			c.q = ring.Make[[]byte](maxQueued(e.cfg.RecvWindow))
		}
		seq := binary.BigEndian.Uint32(body)
		if c.seen.farAhead(seq) {
			// Past what the sender's credits allow: a broken or hostile
			// sender (taken, its number would make old ones new again).
			e.overruns.Add(1)
			c.failLocked(errOverrun)
			return false
		}
		if !c.seen.take(seq) {
			e.duplicates.Add(1)
			return false
		}
		if c.q.Len() == c.q.Cap() {
			e.overruns.Add(1)
			c.failLocked(errOverrun)
			return false
		}
		c.q.Push(p)
		c.wake()
		if c.consumed != c.returned {
			// The sender may be at its window now, the application
			// having taken messages below the threshold before.
			c.armOwedLocked()
		}
		return true
	case kindCredit:
		if !c.creditedLocked(body) {
			e.dropped.Add(1)
		}
	case kindHeartbeat:
		if len(body) != 0 { // a keepalive is its kind byte alone
			e.dropped.Add(1)
		}
	case kindFIN:
		var f wire.FIN
		if wire.DecodeFIN(body, &f) != nil || f.Tag != c.recvTag || f.SenderTag != leg.PeerTag {
			e.dropped.Add(1)
			return false
		}
		c.finLocked(f.Half)
	default:
		e.dropped.Add(1)
	}
	return false
}

// janitor sends keepalives on idle sending legs and ends receiving legs
// whose sender went silent or whose sender's INI was torn down.
func (e *Endpoint) janitor() {
	// At least 1 ns: a Heartbeat of 1 ns is taken as it is, and a tick of
	// 0 made NewTicker panic (TestTinyHeartbeatRuns).
	tick := max(e.cfg.Heartbeat/2, 1)
	t := time.NewTicker(tick)
	defer t.Stop()
	last := time.Now()
	// The links linger an idle timeout: a look at them every quarter of it
	// is enough, and spares the data path's allocation count the look's
	// sets every half heartbeat. The first look comes a quarter after the
	// start too (there is no link to look at before).
	lingerEvery := cmp.Or(e.cfg.linkLinger, e.cfg.IdleTimeout) / 4
	lingerLast := last
	for {
		select {
		case <-e.ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		// If this goroutine itself ran late, the process was starved (or
		// stopped): silence over that time proves nothing about a peer,
		// so it does not count towards the idle timeout.
		late := now.Sub(last) - tick
		last = now
		drains := e.drains.Load()
		var beat []*Conn
		e.mu.Lock()
		for c := range e.conns {
			if c.failed() {
				continue
			}
			if late > e.cfg.Heartbeat {
				c.lastSeen = c.lastSeen.Add(late)
			}
			if c.recvLeg != nil && c.recvUp && !c.recvReleased {
				// (After a half FIN the leg is still held: its sender
				// must go on showing signs of life.)
				// A sender whose INI's CM connection ended (DREQ) is gone
				// once its FIN, if any, cannot still sit in our SRQ: the
				// receive loop emptied the SRQ after the DREQ (or, if
				// nothing arrives at all, half an idle timeout passed).
				gone := c.senderGoneLocked() && ((now.Sub(c.goneAt) > e.cfg.Heartbeat && drains > c.goneDrains) ||
					now.Sub(c.goneAt) > e.cfg.IdleTimeout/2)
				// A dial's acceptor sends nothing on this leg before our
				// first frame (consumeLocked): until a completion says it
				// arrived (firstDue), its silence is waited out as the
				// handshake is, not taken for its death.
				idle := e.cfg.IdleTimeout
				if c.firstDue {
					idle = max(idle, e.cfg.HandshakeTimeout)
				}
				if now.Sub(c.lastSeen) > idle || gone {
					// Failed under the lock the verdict was taken under
					// (errIdle, or the sendGone of a leg refused
					// NO_LISTENER): failed after it, a FIN (or any frame)
					// taken in between did not count, and a peer whose
					// half FIN Recv had read as io.EOF was failed for its
					// silence (TestIdleVerdictTakesFINBeforeIt).
					err := errIdle
					if !c.goneAt.IsZero() {
						// The DREQ came: the sender died, it is not
						// silent, whichever verdict comes first (ours,
						// the idle timeout's, or the keepalive's
						// sendGone). After its half FIN that is no
						// failure (TestHalfFINThenDREQIsNoFailure,
						// ...IdleFirst).
						err = errStaleLink
					}
					c.failLocked(cmp.Or(c.sendGone, err))
					continue
				}
			}
			c.owedCreditsLocked()
			// An inbound half sends nothing before the dialer's first
			// frame: that may be the FIN of a dial given up, whose dialer
			// then lets our leg go at once, perhaps the last on its TGT,
			// and a keepalive there would fail our INI (a recovery for
			// nothing).
			if c.sendUp && !c.sendDone && !c.awaitFirst && now.Sub(c.lastSent) >= e.cfg.Heartbeat && !c.frameWaitingLocked() {
				beat = append(beat, c)
			}
		}
		if now.Sub(lingerLast) >= lingerEvery {
			lingerLast = now
			e.lingerLocked(now)
		}
		e.mu.Unlock()
		for _, c := range beat {
			if res, room, _ := c.post(kindHeartbeat, nil, nil); res == postFull {
				e.mu.Lock()
				if !c.beatWaits {
					c.beatWaits = true // (the spawn fails only as the endpoint closes)
					e.spawn(func() { e.keepaliveWhenRoom(c, room) })
				}
				e.mu.Unlock()
			}
		}
	}
}

// keepaliveWhenRoom posts c's keepalive once its INI's full send queue has
// room, as the senders that keep it full post their messages: dropped at
// each of the janitor's looks, keepalive after keepalive could miss the
// peer's idle timeout on a live connection (found by a review).
func (e *Endpoint) keepaliveWhenRoom(c *Conn, room <-chan struct{}) {
	defer func() {
		e.mu.Lock()
		c.beatWaits = false
		e.mu.Unlock()
	}()
	for {
		select {
		case <-room:
		case <-c.done:
			return
		case <-e.ctx.Done():
			return
		}
		var res postResult
		if res, room, _ = c.post(kindHeartbeat, nil, nil); res != postFull {
			return // posted, or the leg or INI is down (recovery resends)
		}
	}
}

// uplinkFor returns the uplink to use for raddr: an existing one to that
// node and domain (or, the domain unknown, to that node), else nil.
func (e *Endpoint) uplinkForLocked(raddr netip.AddrPort) *uplink {
	dom := e.domainOfLocked(raddr)
	var best *uplink
	for _, u := range e.uplinks {
		if !sameNode(u.node, raddr.Addr()) || u.state == upNone || u.refuted {
			continue
		}
		if dom != 0 && u.dom != 0 && u.dom != dom {
			continue
		}
		if best == nil || (u.state == upUp && best.state != upUp) || (dom != 0 && u.dom == dom && best.dom != dom) {
			best = u
		}
	}
	return best
}

func (e *Endpoint) removeUplinkLocked(u *uplink) {
	e.uplinks = slices.DeleteFunc(e.uplinks, func(x *uplink) bool { return x == u })
}
