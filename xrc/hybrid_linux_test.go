//go:build linux && cgo

package xrc

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/internal/kernel/hybrid"
	"github.com/goxrc/goxrc/internal/kernel/model"
	"github.com/goxrc/goxrc/internal/kernel/real"
	"github.com/goxrc/goxrc/test/softroce"
)

// The engine on the real CM, on two seams. The hybrid (internal/kernel/
// hybrid) carries the physical (XRC-typed) and virtual (SIDR) exchanges
// through the kernel's RDMA CM on soft-RoCE, the QPs and the data path are
// the model's. The real seam is what NewEndpoint opens with Config.Process
// nil: the device of RXE_IP through internal/kernel/real, XRC verbs
// included; its tests skip, saying why, where the device has no XRC
// (soft-RoCE), and fail where it claims XRC but cannot open a domain. Runs
// in the VM of test/vm/rxe-vm.sh (RXE_DEV, RXE_IP); skips elsewhere. Ports
// 20310-20319 (hybrid), 20330-20339 (real).

var hybridFabric = sync.OnceValue(func() *hybrid.Fabric { return hybrid.NewFabric(model.ReuseNever) })

type seam int

const (
	hybridSeam seam = iota
	realSeam
)

// seamEndpoint opens an endpoint on port on the VM's device through seam
// (on the hybrid seam, at the address a mod may set in Config.Addr),
// and returns it with a kill: the process's kill -9 (its kernel closes
// everything at once).
func seamEndpoint(t *testing.T, s seam, port uint16, dir string, mod ...func(*Config)) (*Endpoint, func()) {
	t.Helper()
	if os.Getenv("RXE_DEV") == "" {
		t.Skip("RXE_DEV unset: run through test/vm/rxe-vm.sh")
	}
	ip, err := netip.ParseAddr(os.Getenv("RXE_IP"))
	if err != nil {
		t.Fatalf("RXE_IP: %v", err)
	}
	cfg := Config{Addr: netip.AddrPortFrom(ip, port).String(), DomainDir: dir,
		Heartbeat: 50 * time.Millisecond, IdleTimeout: 2 * time.Second, HandshakeTimeout: 10 * time.Second}
	for _, m := range mod {
		m(&cfg)
	}
	if s == realSeam {
		cfg.Addr = netip.AddrPortFrom(ip, port+20).String()
		e, err := NewEndpoint(context.Background(), cfg)
		if err != nil {
			skipWithoutXRC(t, err)
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		return e, func() { e.k.Close() }
	}
	p, err := hybridFabric().NewProcess(netip.MustParseAddrPort(cfg.Addr).Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	e, err := newEndpoint(context.Background(), p, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e, func() { p.Close() }
}

// skipWithoutXRC skips the test when err is a device's lack of XRC (its
// capability bit clear and ibv_open_xrcd refused), and only then.
func skipWithoutXRC(t *testing.T, err error) {
	t.Helper()
	if errors.Is(err, real.ErrNoXRC) && errors.Is(err, ErrNotSupported) {
		t.Skipf("the device has no XRC, so the engine cannot run on it: %v", err)
	}
}

func TestHybridDialEcho(t *testing.T)       { testDialEcho(t, hybridSeam) }
func TestRealDialEcho(t *testing.T)         { testDialEcho(t, realSeam) }
func TestHybridKillTGTCreator(t *testing.T) { testKillTGTCreator(t, hybridSeam) }
func TestRealKillTGTCreator(t *testing.T)   { testKillTGTCreator(t, realSeam) }
func TestHybridKillSender(t *testing.T)     { testKillSender(t, hybridSeam) }
func TestRealKillSender(t *testing.T)       { testKillSender(t, realSeam) }

func TestHybridSecondPollerHonoursContext(t *testing.T) { testSecondPoller(t, hybridSeam) }
func TestRealSecondPollerHonoursContext(t *testing.T)   { testSecondPoller(t, realSeam) }

// testSecondPoller: while the endpoint's receive loop waits on its SRQ
// without a deadline, a second poller of that SRQ returns when its own
// context ends. The seam's contract (kernel.Kernel's PollRecv): on the
// hybrid it checks the model's polling; the real seam's fix (a poller
// queued behind the first one's wait, however short its deadline) is
// checked only where a device has XRC.
func testSecondPoller(t *testing.T, sm seam) {
	e, _ := seamEndpoint(t, sm, 20310, t.TempDir()+"/goxrc")
	time.Sleep(50 * time.Millisecond) // the receive loop is in its wait
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		var out [1]kernel.RecvCompletion
		_, err := e.k.PollRecv(ctx, e.srq, out[:])
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("second poller: %v, want its deadline", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("second poller with a 100 ms deadline still waiting after 5 s")
	}
}

// testDialEcho: logical connections between two endpoints on one node
// over the real CM: one uplink each way however many connections, echo on
// every one, then a graceful close.
func testDialEcho(t *testing.T, sm seam) {
	checkGoroutines(t)
	dir := t.TempDir() + "/goxrc"
	srv, _ := seamEndpoint(t, sm, 20311, dir)
	cli, _ := seamEndpoint(t, sm, 20312, dir)
	ctx := ctxT(t, 60*time.Second)

	const n = 20
	go func() {
		for {
			c, err := srv.Accept(ctx)
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 4096)
				for {
					k, err := c.Recv(ctx, buf)
					if err != nil {
						return
					}
					if err := c.Send(ctx, buf[:k]); err != nil {
						return
					}
				}
			}()
		}
	}()
	start := time.Now()
	conns := make([]*Conn, n)
	for i := range conns {
		c, err := cli.Dial(ctx, srv.Addr().String())
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		conns[i] = c
	}
	t.Logf("%d dials over the real CM in %v", n, time.Since(start))
	buf := make([]byte, 4096)
	for i, c := range conns {
		msg := fmt.Sprintf("hello %d", i)
		if err := c.Send(ctx, []byte(msg)); err != nil {
			t.Fatal(err)
		}
		k, err := c.Recv(ctx, buf)
		if err != nil || string(buf[:k]) != msg {
			t.Fatalf("conn %d: %q, %v", i, buf[:k], err)
		}
	}
	cs, ss := cli.Stats(), srv.Stats()
	t.Logf("client %+v", cs)
	t.Logf("server %+v", ss)
	if cs.Uplinks != 1 || ss.Uplinks != 1 {
		t.Errorf("uplinks: client %d, server %d; want one each way for %d connections", cs.Uplinks, ss.Uplinks, n)
	}
	if cs.Rejected != 0 || ss.Rejected != 0 || cs.Recoveries != 0 || ss.Recoveries != 0 {
		t.Errorf("rejects/recoveries: client %d/%d, server %d/%d", cs.Rejected, cs.Recoveries, ss.Rejected, ss.Recoveries)
	}
	for _, c := range conns {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	}
}

func quickIdle(c *Config) { c.Heartbeat, c.IdleTimeout = 50*time.Millisecond, 400*time.Millisecond }

// threeOnOneDomain opens three endpoints through sm on one node and one
// domain (quickIdle), at port, port+1 and port+2: a sender s and two
// receivers, r1 and r2. It returns them with their kills (seamEndpoint).
func threeOnOneDomain(t *testing.T, sm seam, port uint16) (s, r1, r2 *proc, kill, kill1 func()) {
	t.Helper()
	dir := t.TempDir() + "/goxrc"
	se, kill := seamEndpoint(t, sm, port, dir, quickIdle)
	r1e, kill1 := seamEndpoint(t, sm, port+1, dir, quickIdle)
	r2e, _ := seamEndpoint(t, sm, port+2, dir, quickIdle)
	return &proc{Endpoint: se}, &proc{Endpoint: r1e}, &proc{Endpoint: r2e}, kill, kill1
}

// testKillTGTCreator: on one node and one domain, s reaches r1 (which
// creates the TGT: PHYS_REQ over the real XRC-typed CM) and r2 (which opens
// it: VIRT_REQ over real SIDR). r1's process dies: its TGT-side CM id goes
// without a DREQ (the real kernel's rule), r2 keeps talking to s, and s's
// connection to r1 fails with ErrPeerGone.
func testKillTGTCreator(t *testing.T, sm seam) {
	checkGoroutines(t)
	s, r1, r2, _, kill1 := threeOnOneDomain(t, sm, 20313)
	s1, _ := pair(t, s, r1)
	s2, c2 := pair(t, s, r2)
	roundTrip(t, s2, c2, []byte("before"))
	if st := s.Stats(); st.Uplinks != 1 {
		t.Errorf("sender %+v: want one uplink to the node's domain", st)
	}
	kill1() // kill -9
	deadline := time.Now().Add(6 * 400 * time.Millisecond)
	for i := 0; time.Now().Before(deadline); i++ {
		roundTrip(t, s2, c2, fmt.Appendf(nil, "to r2 %d", i))
		roundTrip(t, c2, s2, fmt.Appendf(nil, "from r2 %d", i))
		time.Sleep(2 * time.Millisecond)
	}
	if _, err := s1.Recv(ctxT(t, 5*time.Second), make([]byte, 8)); !errors.Is(err, ErrPeerGone) {
		t.Fatalf("connection to the dead process: %v, want ErrPeerGone", err)
	}
	eventually(t, "only r2's connection left at s", func() (bool, string) {
		st := s.Stats()
		return st.Conns == 1, fmt.Sprintf("%+v", st)
	})
	roundTrip(t, s2, c2, []byte("still there"))
	t.Logf("sender %+v, r2 %+v", s.Stats(), r2.Stats())
}

// testKillSender: the sender's process dies; the kernel's DREQ for
// its INI-side CM id reaches the TGT's creator, the idle timeout the
// sharer; both receivers end up with no connection and no downlink.
func testKillSender(t *testing.T, sm seam) {
	checkGoroutines(t)
	s, r1, r2, kill, _ := threeOnOneDomain(t, sm, 20316)
	_, c1 := pair(t, s, r1)
	_, c2 := pair(t, s, r2)
	kill() // kill -9
	for i, c := range []*Conn{c1, c2} {
		if _, err := c.Recv(ctxT(t, 5*time.Second), make([]byte, 8)); !errors.Is(err, ErrPeerGone) {
			t.Errorf("receiver %d: %v, want ErrPeerGone", i+1, err)
		}
	}
	for i, r := range []*proc{r1, r2} {
		eventually(t, fmt.Sprintf("receiver %d released the dead sender", i+1), func() (bool, string) {
			st := r.Stats()
			return st.Conns == 0 && st.LocalCounts == 0, fmt.Sprintf("%+v", st)
		})
	}
	t.Logf("r1 %+v, r2 %+v", r1.Stats(), r2.Stats())
}

// TestHybridTwoAddressesOneDevice: two nodes by address on one device. An
// endpoint on a second address of the device dials one on the first, a
// PHYS_REQ and then a VIRT_REQ, over the real CM. The dialer's CM ids must
// resolve from its own address: from the wildcard, the kernel picks the
// destination's own address as the source (a local route), so the acceptor
// would see the request come from its own node, and on a node whose route
// leaves by another device the CM id and the INI would be on two devices.
func TestHybridTwoAddressesOneDevice(t *testing.T) {
	checkGoroutines(t)
	if os.Getenv("RXE_DEV") == "" {
		t.Skip("RXE_DEV unset: run through test/vm/rxe-vm.sh")
	}
	ip1, err := netip.ParseAddr(os.Getenv("RXE_IP"))
	if err != nil || !ip1.Is4() {
		t.Fatalf("RXE_IP %q: want an IPv4 address (%v)", os.Getenv("RXE_IP"), err)
	}
	ip2 := softroce.SecondAddress(t, os.Getenv("RXE_DEV"), ip1)
	at := func(ip netip.Addr) func(*Config) {
		return func(c *Config) { c.Addr = netip.AddrPortFrom(ip, netip.MustParseAddrPort(c.Addr).Port()).String() }
	}
	srvE, _ := seamEndpoint(t, hybridSeam, 20319, t.TempDir()+"/goxrc", at(ip1))
	cliE, _ := seamEndpoint(t, hybridSeam, 20319, t.TempDir()+"/goxrc", at(ip2))
	srv, cli := &proc{Endpoint: srvE}, &proc{Endpoint: cliE}
	for i := range 2 { // PHYS_REQ, then VIRT_REQ over the uplink it made
		c, s := pair(t, cli, srv) // checks each side sees the other's address
		roundTrip(t, c, s, fmt.Appendf(nil, "to %d", i))
		roundTrip(t, s, c, fmt.Appendf(nil, "from %d", i))
	}
	if cs, ss := cli.Stats(), srv.Stats(); cs.Uplinks != 1 || ss.Uplinks != 1 || cs.VirtReqs != 1 {
		t.Errorf("client %+v, server %+v: want one uplink each way, one VIRT_REQ", cs, ss)
	}
}
