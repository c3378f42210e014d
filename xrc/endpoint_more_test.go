package xrc

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/verbs"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// Every wait honours its context; Close is idempotent and wakes every
// waiter; a closed endpoint refuses work.
func TestEndpointContextsAndClose(t *testing.T) {
	w := newWorld(t)
	if _, err := NewEndpoint(context.Background(), Config{Process: &memfabric.Process{}, Addr: "10.0.10.1:1"}); !errors.Is(err, ErrNoKernel) {
		t.Fatalf("a process without a kernel: %v", err)
	}
	if _, err := NewEndpoint(context.Background(), Config{Process: w.f.Node("10.0.10.1").Process(), Addr: "10.9.9.9:1", DomainDir: t.TempDir() + "/d"}); err == nil {
		t.Fatal("listening on another node's address worked")
	}
	a, b := w.endpoint("10.0.10.1", 0), w.endpoint("10.0.10.2", 7000)
	if a.Addr().Port() == 0 {
		t.Fatal("port 0 was not replaced")
	}
	// No listener there.
	_, err := a.Dial(ctxT(t, time.Second), "10.0.10.2:7999")
	var rj *RejectError
	if !errors.As(err, &rj) || rj.Reason != RejectNoListener {
		t.Fatalf("dial to nobody: %v", err)
	}
	// A cancelled context.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := a.Dial(ctx, b.Addr().String()); !errors.Is(err, context.Canceled) {
		t.Fatalf("dial with a cancelled context: %v", err)
	}
	short, cancel2 := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel2()
	if _, err := a.Accept(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("accept with nothing to accept: %v", err)
	}
	ca, cb := pair(t, a, b)
	short2, cancel3 := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel3()
	if _, err := ca.Recv(short2, make([]byte, 4)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("recv with nothing to receive: %v", err)
	}
	// Close wakes a blocked Recv and a blocked Accept.
	errs := make(chan error, 2)
	go func() { _, err := ca.Recv(context.Background(), make([]byte, 4)); errs <- err }()
	go func() { _, err := a.Accept(context.Background()); errs <- err }()
	time.Sleep(20 * time.Millisecond)
	a.Close()
	for range 2 {
		select {
		case err := <-errs:
			if !errors.Is(err, ErrClosed) {
				t.Fatalf("woken with %v, want ErrClosed", err)
			}
		case <-time.After(2 * time.Second):
			t.Fatal("Close did not wake a waiter")
		}
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Dial(ctxT(t, time.Second), b.Addr().String()); !errors.Is(err, ErrClosed) {
		t.Fatalf("dial on a closed endpoint: %v", err)
	}
	if err := ca.Send(ctxT(t, time.Second), []byte("x")); !errors.Is(err, ErrClosed) {
		t.Fatalf("send on a closed endpoint's connection: %v", err)
	}
	_ = cb
}

// Dials to several processes of one node at once: the first makes the
// uplink (CONNECTING), the others queue behind it and then join it with
// VIRT_REQs. One INI from the sender, one TGT shared by all receivers.
func TestEndpointDialsQueueWhileConnecting(t *testing.T) {
	const R = 6
	w := newWorld(t)
	s := w.endpoint("10.0.11.1", 7000)
	var rs []*proc
	for i := range R {
		rs = append(rs, w.endpoint("10.0.11.2", 7001+i))
	}
	var wg sync.WaitGroup
	conns := make([]*Conn, R)
	for i, r := range rs {
		wg.Add(2)
		go func() {
			defer wg.Done()
			c, err := s.Dial(ctxT(t, 5*time.Second), r.Addr().String())
			if err != nil {
				t.Errorf("dial %d: %v", i, err)
			}
			conns[i] = c
		}()
		go func() {
			defer wg.Done()
			if _, err := r.Accept(ctxT(t, 5*time.Second)); err != nil {
				t.Errorf("accept %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	if st := s.Stats(); st.Uplinks != 1 || st.Conns != R {
		t.Fatalf("sender: %+v, want one uplink", st)
	}
	b := w.f.Node("10.0.11.2").Stats()
	if b.TGTs != 1 || b.TGTHandles != R || b.INIs != R {
		t.Fatalf("node B: %+v, want 1 TGT with %d handles (and %d INIs back)", b, R, R)
	}
}

// Two domains on one node (two domain directories): a VIRT_REQ over the
// uplink to the first domain is refused DOMAIN_MISMATCH with the other
// domain's id, and the dial moves to an uplink of that domain.
func TestEndpointDomainMismatchReroutes(t *testing.T) {
	w := newWorld(t)
	s := w.endpoint("10.0.12.1", 7000)
	r1 := w.endpoint("10.0.12.2", 7001)
	other := t.TempDir() + "/other"
	r2 := w.endpoint("10.0.12.2", 7002, func(c *Config) { c.DomainDir = other })
	if r1.dom.ID == r2.dom.ID {
		t.Fatal("one domain")
	}
	s1, c1 := pair(t, s, r1)
	s2, c2 := pair(t, s, r2)
	roundTrip(t, s1, c1, []byte("domain 1"))
	roundTrip(t, s2, c2, []byte("domain 2"))
	if st := s.Stats(); st.Uplinks != 2 {
		t.Fatalf("sender: %+v, want an uplink per domain", st)
	}
	if r2.Stats().Rejected != 1 {
		t.Fatalf("r2 rejected %d requests, want the one DOMAIN_MISMATCH", r2.Stats().Rejected)
	}
	if b := w.f.Node("10.0.12.2").Stats(); b.TGTs != 2 || b.XRCDs != 2 {
		t.Fatalf("node B: %+v", b)
	}
}

// TestEndpointReverseLegIntoDialersDomain: two domains on the dialer's
// node. The acceptor a holds an uplink into the first (made for p1's
// connection) when p2, of the second domain, dials it for the first time
// over an uplink p2 already has (made by dialing a2, a's neighbour). a must
// not put a reverse leg over its uplink into p1's domain in the ACCEPT:
// p2 refuses such a leg and the dial failed, every time, since a never
// learned p2's domain. a now answers the old way (a reciprocal request,
// which learns the domain), and p2's next dials take one exchange.
func TestEndpointReverseLegIntoDialersDomain(t *testing.T) {
	w := newWorld(t)
	a := w.endpoint("10.0.40.1", 7000)
	a2 := w.endpoint("10.0.40.1", 7001)
	p1 := w.endpoint("10.0.40.2", 7000)
	p2 := w.endpoint("10.0.40.2", 7001, func(c *Config) { c.DomainDir = t.TempDir() + "/other" })
	if p1.dom.ID == p2.dom.ID {
		t.Fatal("one domain")
	}
	pair(t, p1, a)
	pair(t, p2, a2)
	for i := 0; i < 3; i++ {
		before := p2.Stats().OneExchange
		c, d := pair(t, p2, a)
		roundTrip(t, c, d, []byte("p2 to a"))
		roundTrip(t, d, c, []byte("a to p2"))
		if one := p2.Stats().OneExchange - before; (i == 0) != (one == 0) {
			t.Fatalf("dial %d took %d one-exchange reverse legs: want none the first time (domain unknown), one after", i, one)
		}
	}
}

// Config.DialOnly (cm's shared dialer endpoints): the endpoint's own dials
// work both ways, their reverse legs by the peer's reciprocal request (which
// the endpoint takes) and inside the ACCEPT (which it registers itself),
// while a dial into it is refused APP_REJECT before anything is made, by
// VIRT_REQ (a peer with an uplink there) and by PHYS_REQ (one without):
// its downlinks, counts, connections and its node's QPs stay as they were.
func TestEndpointDialOnly(t *testing.T) {
	w := newWorld(t)
	d := w.endpoint("10.0.64.1", 7000, func(c *Config) { c.DialOnly = true })
	b := w.endpoint("10.0.64.2", 7000)
	x := w.endpoint("10.0.64.3", 7000) // no uplink to d's node: its dial there is a PHYS_REQ
	var keep [][2]*Conn
	for i := range 2 { // a PHYS forward leg and a reciprocal reverse leg, then one exchange
		c, s := pair(t, d, b)
		roundTrip(t, c, s, []byte(fmt.Sprint("to b ", i)))
		roundTrip(t, s, c, []byte(fmt.Sprint("to d ", i)))
		keep = append(keep, [2]*Conn{c, s})
	}
	if st := d.Stats(); st.OneExchange != 1 {
		t.Fatalf("d's second dial should take one exchange: %+v", st)
	}
	// The SIDR id of d's VIRT_REQ (its second dial), counted before it
	// goes, is a kernel handle that "as they were" never comes back to.
	sidrIDsDestroyed(t, d)
	before, node := d.Stats(), w.f.Node("10.0.64.1").Stats()
	vb := b.Stats().VirtReqs
	for _, p := range []*proc{b, x} {
		_, err := p.Dial(ctxT(t, 2*time.Second), d.Addr().String())
		var rj *RejectError
		if !errors.As(err, &rj) || rj.Reason != RejectApp {
			t.Fatalf("dial %v -> DialOnly %v: %v, want APP_REJECT", p.Addr(), d.Addr(), err)
		}
	}
	if n := b.Stats().VirtReqs - vb; n != 1 {
		t.Fatalf("b sent %d VIRT_REQs for its dial, want 1", n)
	}
	eventually(t, "d and its node as they were", func() (bool, string) {
		st, n := d.Stats(), w.f.Node("10.0.64.1").Stats()
		ok := st.Downlinks == before.Downlinks && st.LocalCounts == before.LocalCounts && st.Conns == before.Conns &&
			st.KernelHandles == before.KernelHandles && st.Rejected == before.Rejected+2 && n == node
		return ok, fmt.Sprintf("%+v (was %+v), node %+v (was %+v)", st, before, n, node)
	})
	for i, k := range keep {
		roundTrip(t, k[0], k[1], []byte(fmt.Sprint("still to b ", i)))
		roundTrip(t, k[1], k[0], []byte(fmt.Sprint("still to d ", i)))
	}
}

// Close while dials are in flight: every dial ends (a connection, or an
// error) and every Close of their connections returns, long before any
// timeout; nothing panics (a spawn racing Close's Wait used to: "WaitGroup
// is reused before previous Wait has returned"); no goroutine outlives the
// test (newWorld checks); Close leaves no INI behind, and the next
// process's first dial gets through (see staleReject). Afterwards the endpoint starts no goroutine, and a finished
// exchange's SIDR id is destroyed at once instead of in the background.
func TestEndpointCloseDuringDials(t *testing.T) {
	w := newWorld(t)
	b := w.endpoint("10.0.11.2", 7000)
	// b accepts (and drops) what comes: a queue left full would refuse
	// the dials (BUSY_RETRY), finished connections included.
	actx, stop := context.WithCancel(context.Background())
	accepting := make(chan struct{})
	go func() {
		defer close(accepting)
		for {
			c, err := b.Accept(actx)
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	defer func() { stop(); <-accepting }()
	for round := 0; round < 5; round++ {
		a := w.endpoint("10.0.11.1", 7100+round)
		// The first dial makes the uplinks, so the others are virtual
		// links with a SIDR exchange each.
		// b's queue may still be full of the last round's connections
		// (acceptBacklog), which its accept loop takes and closes one by
		// one: BUSY_RETRY says to ask again, as an application would.
		var first *Conn
		var err error
		for try := time.Now(); ; time.Sleep(10 * time.Millisecond) {
			first, err = a.Dial(ctxT(t, 2*time.Second), b.Addr().String())
			if !busyReject(err) || time.Since(try) > testHandshake {
				break
			}
		}
		if err != nil {
			// Each round's process is new on the same node, and the model
			// hands its INI the last round's number while b may still hold
			// that connection: the dial must ride out the stale reject.
			t.Fatalf("round %d: %v; b %+v", round, err, b.Stats())
		}
		var wg sync.WaitGroup
		for i := 0; i < 8; i++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					c, err := a.Dial(ctxT(t, 2*time.Second), b.Addr().String())
					if err != nil {
						return
					}
					c.Close()
				}
			}()
		}
		time.Sleep(time.Duration(round+1) * 5 * time.Millisecond)
		a.Close()
		// A connection's Close that raced the endpoint's used to wait for
		// its FIN's completion until the handshake timeout (5 s here); the
		// dials' own contexts are 2 s.
		dialsDone := make(chan struct{})
		go func() { wg.Wait(); close(dialsDone) }()
		select {
		case <-dialsDone:
		case <-time.After(testHandshake / 2):
			t.Fatal("dials and closes still blocked after the endpoint closed")
		}
		first.Close()
		if st := w.f.Node("10.0.11.1").Stats(); st.INIs != 0 {
			t.Fatalf("round %d: INIs left after Close: %+v", round, st)
		}
		ran := false
		if a.spawn(func() { ran = true }) || ran {
			t.Fatal("a closed endpoint started a goroutine")
		}
		if n := a.sidrGoing.Load(); n != 0 {
			t.Fatalf("%d SIDR ids left to destroy after Close", n)
		}
	}
}

// TestEndpointCloseEndsWaitingDial: Close ends a Dial whose exchange waits
// for a peer that never answers (its listeners take requests and say
// nothing), with ErrClosed, long before the dial's own deadline. The
// exchanges used to wait on the dial's context only, so Close returned and
// the Dial waited on until its deadline.
func TestEndpointCloseEndsWaitingDial(t *testing.T) {
	w := newWorld(t)
	d := w.endpoint("10.0.42.1", 7000)
	k := w.rawKernel("10.0.42.2")
	peer := netip.MustParseAddrPort("10.0.42.2:7000")
	for _, ex := range []kernel.Exchange{kernel.ExchangeXRC, kernel.ExchangeSIDR} {
		if _, err := k.Listen(peer, ex); err != nil {
			t.Fatal(err)
		}
	}
	errc := make(chan error, 1)
	go func() {
		_, err := d.Dial(ctxT(t, 20*time.Second), peer.String())
		errc <- err
	}()
	time.Sleep(100 * time.Millisecond) // the PHYS_REQ is out
	d.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("Dial ended by Close: %v, want ErrClosed", err)
		}
	case <-time.After(testHandshake):
		t.Fatal("Dial still waiting for its peer after the endpoint closed")
	}
}

// wildcardHeld answers the first Listen as the kernel's CM does when the
// random port is held by another process's id bound to the wildcard
// address (cma_check_port: EADDRNOTAVAIL, not EADDRINUSE).
type wildcardHeld struct {
	kernel.Kernel
	n atomic.Int32
}

func (k *wildcardHeld) Listen(a netip.AddrPort, ex kernel.Exchange) (kernel.ID, error) {
	if k.n.Add(1) == 1 {
		return 0, &verbs.OpError{Op: "rdma_create_ep", Addr: a.String(), Err: syscall.EADDRNOTAVAIL}
	}
	return k.Kernel.Listen(a, ex)
}

// An endpoint on a random port tries another when the kernel says the
// port's address is unavailable, as it does for a port another process
// holds on the wildcard address: it failed with that error (the model only
// ever answers EADDRINUSE).
func TestEndpointListenRetriesWildcardPortConflict(t *testing.T) {
	w := newWorld(t)
	p := w.f.Node("10.0.9.1").Process()
	k, _ := kernel.Unwrap(p)
	cfg := Config{Process: p, Addr: "10.0.9.1:0", DomainDir: t.TempDir() + "/goxrc",
		Heartbeat: testHeartbeat, IdleTimeout: testIdle, HandshakeTimeout: testHandshake}
	e, err := newEndpoint(context.Background(), &wildcardHeld{Kernel: k}, cfg)
	if err != nil {
		t.Fatalf("a random port held on the wildcard address failed the endpoint: %v", err)
	}
	e.Close()
}
