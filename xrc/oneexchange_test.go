package xrc

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/xrc/internal/wire"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// pairAcceptorFirst is pair, but the acceptor sends first, as soon as its
// Accept returns (possibly before the dialer's Dial has returned), and the
// dialer answers.
func pairAcceptorFirst(t *testing.T, a, b *proc, i int) (*Conn, *Conn) {
	t.Helper()
	type res struct {
		c   *Conn
		err error
	}
	ch := make(chan res, 1)
	msg := fmt.Sprintf("from acceptor %d", i)
	go func() {
		c, err := b.Accept(ctxT(t, 5*time.Second))
		if err == nil {
			err = c.Send(ctxT(t, 5*time.Second), []byte(msg))
		}
		ch <- res{c, err}
	}()
	ca, err := a.Dial(ctxT(t, 5*time.Second), b.Addr().String())
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	buf := make([]byte, 64)
	n, err := ca.Recv(ctxT(t, 5*time.Second), buf)
	if err != nil || string(buf[:n]) != msg {
		t.Fatalf("dialer recv: %q %v", buf[:n], err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatalf("accept/send: %v", r.err)
	}
	roundTrip(t, ca, r.c, []byte("from dialer"))
	return ca, r.c
}

// With live uplinks both ways, a logical connection costs one SIDR exchange:
// the reverse leg rides the forward leg's ACCEPT, in both directions.
func TestOneExchangePerConn(t *testing.T) {
	w := newWorld(t)
	a := w.endpoint("10.0.7.1", 7000)
	b := w.endpoint("10.0.7.2", 7000)
	pair(t, a, b) // the uplinks, both ways (PHYS)
	sa, sb := a.Stats(), b.Stats()
	const n = 8
	var conns []*Conn
	for i := range n {
		ca, cb := pairAcceptorFirst(t, a, b, i)
		conns = append(conns, ca, cb)
	}
	for i := range n {
		cb, ca := pairAcceptorFirst(t, b, a, i)
		conns = append(conns, ca, cb)
	}
	ea, eb := a.Stats(), b.Stats()
	if d := ea.VirtReqs - sa.VirtReqs; d != n {
		t.Errorf("a sent %d VIRT_REQs for %d dials of its own and %d of b's, want %d", d, n, n, n)
	}
	if d := eb.VirtReqs - sb.VirtReqs; d != n {
		t.Errorf("b sent %d VIRT_REQs, want %d", d, n)
	}
	if d := ea.OneExchange - sa.OneExchange; d != 2*n {
		t.Errorf("a: %d one-exchange reverse legs, want %d", d, 2*n)
	}
	if ea.Uplinks != 1 || eb.Uplinks != 1 || ea.Downlinks != 1 || eb.Downlinks != 1 {
		t.Errorf("QPs: a %+v, b %+v", ea, eb)
	}
	if ea.LocalCounts != 2*n+1 || ea.Conns != 2*n+1 {
		t.Errorf("a: %d local counts, %d conns; want %d", ea.LocalCounts, ea.Conns, 2*n+1)
	}
	for _, c := range conns {
		c.Close()
	}
	eventually(t, "legs released", func() (bool, string) {
		x, y := a.Stats(), b.Stats()
		return x.LocalCounts == 1 && y.LocalCounts == 1 && x.Conns == 1 && y.Conns == 1, fmt.Sprintf("a %+v b %+v", x, y)
	})
	a.mu.Lock()
	nrecv := len(a.recv)
	a.mu.Unlock()
	if nrecv != 1 {
		t.Errorf("a's receive table has %d entries, want 1", nrecv)
	}
}

// An acceptor without a live uplink to the dialer's node cannot put the
// reverse leg in its ACCEPT: it makes the uplink (the old reciprocal path);
// the next connection then takes one exchange.
func TestOneExchangeFallback(t *testing.T) {
	w := newWorld(t)
	a := w.endpoint("10.0.8.1", 7000)
	b1 := w.endpoint("10.0.8.2", 7000)
	b2 := w.endpoint("10.0.8.2", 7001) // same node and domain: a's uplink serves it
	pair(t, a, b1)
	sa := a.Stats()
	pairAcceptorFirst(t, a, b2, 0)
	ea, e2 := a.Stats(), b2.Stats()
	if ea.VirtReqs-sa.VirtReqs != 1 || ea.OneExchange != sa.OneExchange || e2.OneExchange != 0 {
		t.Fatalf("first dial to b2: a %+v (was %+v), b2 %+v", ea, sa, e2)
	}
	if e2.Uplinks != 1 || e2.VirtReqs != 0 {
		t.Fatalf("b2 should have made its uplink by PHYS_REQ: %+v", e2)
	}
	pairAcceptorFirst(t, a, b2, 1)
	fa, f2 := a.Stats(), b2.Stats()
	if fa.VirtReqs-ea.VirtReqs != 1 || f2.VirtReqs != 0 || fa.OneExchange-ea.OneExchange != 1 || f2.OneExchange != 1 {
		t.Fatalf("second dial to b2: a %+v, b2 %+v", fa, f2)
	}
}

// A hostile ACCEPT naming a reverse leg that fails verification fails the
// dial and leaves nothing behind: no TGT handle, count, leg, tag or CM id.
// One naming a TGT that is not the peer's looks like an honest peer whose
// TGT here just went, and one into another domain like an honest peer that
// learned our address's domain from an earlier process (see Endpoint.Dial):
// the dial tries once more, asking for the reverse leg by its own exchange
// (no FlagOneExchange), which this fake refuses. (The domain case failed the
// dial at once until the domain mismatch was taken for a stale domain:
// TestDomainRelearnedAfterAddressReused.)
func TestOneExchangeHostileAccept(t *testing.T) {
	w := newWorld(t)
	a := w.endpoint("10.0.6.1", 7000)
	a2 := w.endpoint("10.0.6.1", 7001)
	b := w.endpoint("10.0.6.2", 7000)
	x := w.endpoint("10.0.6.3", 7000)
	pair(t, a, b)  // a's uplink to node B; b's TGT on node A, held by a
	pair(t, x, a2) // x's TGT on node A, held by a2 only
	k := w.rawKernel("10.0.6.2")
	fake := netip.MustParseAddrPort("10.0.6.2:7100")
	l, err := k.Listen(fake, kernel.ExchangeSIDR)
	if err != nil {
		t.Fatal(err)
	}
	upOf := func(p *proc) (ini, tgt uint32) {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.uplinks[0].cur.num, p.uplinks[0].cur.tgt
	}
	bINI, bTGT := upOf(b)
	xINI, xTGT := upOf(x)
	domA := a.dom.ID
	var bLeg uint32 // b's tag for the leg a holds from it (pair's reciprocal leg)
	a.mu.Lock()
	for c := range a.conns {
		if c.recvLeg != nil && c.recvLeg.PeerIncarnation == b.inc {
			bLeg = c.recvLeg.PeerTag
		}
	}
	a.mu.Unlock()
	if bLeg == 0 {
		t.Fatal("a holds no leg from b")
	}
	cases := []struct {
		name string
		inc  uint64
		rev  wire.Reverse
		want error
	}{
		{"held TGT, other incarnation", 0xBAD2, wire.Reverse{Tag: 5, INIQPN: bINI, TGTQPN: bTGT, DomainID: domA}, errBusy},
		{"held TGT, other INI", b.inc, wire.Reverse{Tag: 5, INIQPN: bINI + 1, TGTQPN: bTGT, DomainID: domA}, errBusy},
		{"no such TGT", b.inc, wire.Reverse{Tag: 5, INIQPN: bINI, TGTQPN: 0xFFFF00, DomainID: domA}, errBusy},
		{"another node's TGT", x.inc, wire.Reverse{Tag: 5, INIQPN: xINI, TGTQPN: xTGT, DomainID: domA}, errBusy},
		{"another domain", b.inc, wire.Reverse{Tag: 5, INIQPN: bINI, TGTQPN: bTGT, DomainID: domA + 1}, errBusy},
		{"a leg already held", b.inc, wire.Reverse{Tag: bLeg, INIQPN: bINI, TGTQPN: bTGT, DomainID: domA}, errBadReverse},
	}
	for _, tc := range cases {
		before, nodeX := a.Stats(), w.f.Node("10.0.6.1").Stats()
		a.mu.Lock()
		nrecv := len(a.recv)
		a.mu.Unlock()
		done := make(chan error, 1)
		go func() {
			err := fakeAccept(t, k, l, tc.inc, tc.rev, b.srqn)
			if err == nil && tc.want == errBusy {
				err = fakeRejectRetry(t, k, l)
			}
			done <- err
		}()
		_, err := a.Dial(ctxT(t, 5*time.Second), fake.String())
		if ferr := <-done; ferr != nil {
			t.Fatalf("%s: fake acceptor: %v", tc.name, ferr)
		}
		var rj *RejectError
		if tc.want == errBusy && !(errors.As(err, &rj) && rj.Reason == RejectBusyRetry) || tc.want != errBusy && !errors.Is(err, tc.want) {
			t.Fatalf("%s: dial: %v, want %v", tc.name, err, tc.want)
		}
		eventually(t, tc.name+": nothing left", func() (bool, string) {
			s := a.Stats()
			a.mu.Lock()
			r := len(a.recv)
			a.mu.Unlock()
			ok := s.KernelHandles == before.KernelHandles && s.Downlinks == before.Downlinks &&
				s.LocalCounts == before.LocalCounts && s.Conns == before.Conns && r == nrecv &&
				w.f.Node("10.0.6.1").Stats() == nodeX
			return ok, fmt.Sprintf("%+v (was %+v), recv %d (was %d)", s, before, r, nrecv)
		})
		if a.acc.LocalCount(xTGT) != 0 || a2.acc.LocalCount(xTGT) != 1 {
			t.Fatalf("%s: x's TGT counts: a %d, a2 %d", tc.name, a.acc.LocalCount(xTGT), a2.acc.LocalCount(xTGT))
		}
	}
	// The real connections still work.
	pair(t, a, b)
}

// errBusy matches a dial refused with BUSY_RETRY.
var errBusy = &RejectError{Reason: RejectBusyRetry}

// fakeRejectRetry refuses, with BUSY_RETRY, a VIRT_REQ that must come
// without FlagOneExchange (a dial's fresh attempt after errReverseGone).
func fakeRejectRetry(t *testing.T, k kernel.Kernel, l kernel.ID) error {
	id, req, err := nextVirtReq(t, k, l)
	if err != nil {
		return err
	}
	defer k.DestroyID(id)
	if req.Flags&wire.FlagOneExchange != 0 {
		return errors.New("the fresh attempt asks for one exchange again")
	}
	r := wire.Reject{Tag: req.ConnTag, Reason: wire.RejectBusyRetry, MinVersion: wire.MinVersion, MaxVersion: wire.MaxVersion}
	buf := make([]byte, wire.BudgetSIDRREP)
	n, err := r.Encode(buf)
	if err != nil {
		return err
	}
	return k.Reject(id, buf[:n])
}

// fakeAccept answers one ONE_EXCHANGE VIRT_REQ on l with an ACCEPT whose
// reverse section is rev, from incarnation inc.
func fakeAccept(t *testing.T, k kernel.Kernel, l kernel.ID, inc uint64, rev wire.Reverse, srqn uint32) error {
	id, req, err := nextVirtReq(t, k, l)
	if err != nil {
		return err
	}
	defer k.DestroyID(id)
	if req.Flags&wire.FlagOneExchange == 0 {
		return errors.New("no FlagOneExchange")
	}
	m := wire.Accept{Flags: wire.AcceptReverse, TagEcho: req.ConnTag, AcceptorTag: 99, Incarnation: inc,
		TGTQPN: req.TGTQPNHint, SRQN: srqn, DomainID: req.DomainHint, Credits: 8, MaxMessage: MaxMessageSize, Rev: rev}
	buf := make([]byte, wire.BudgetSIDRREP)
	n, err := m.Encode(buf)
	if err != nil {
		return err
	}
	return k.Accept(id, req.TGTQPNHint, buf[:n])
}

// nextVirtReq waits for the next request on l, a VIRT_REQ, and returns its
// CM id (the caller's to destroy) and the request.
// heldOneExchangeReq takes the next VIRT_REQ on l, which must ask for its
// reverse leg in the ACCEPT, and leaves it unanswered.
func heldOneExchangeReq(t *testing.T, k kernel.Kernel, l kernel.ID) (kernel.ID, wire.Req) {
	t.Helper()
	id, req, err := nextVirtReq(t, k, l)
	if err != nil {
		t.Fatal(err)
	}
	if req.Flags&wire.FlagOneExchange == 0 {
		t.Fatal("setup: the dial asks for no reverse leg in its ACCEPT")
	}
	return id, req
}

func nextVirtReq(t *testing.T, k kernel.Kernel, l kernel.ID) (kernel.ID, wire.Req, error) {
	var req wire.Req
	ev, err := k.Event(ctxT(t, 5*time.Second), l)
	if err != nil {
		return 0, req, err
	}
	if err := wire.DecodeReq(ev.PrivateData, wire.TypeVirtReq, &req); err != nil {
		k.DestroyID(ev.ID)
		return 0, req, err
	}
	return ev.ID, req, nil
}

// spoilReverse passes a kernel through, but turns the reverse section of
// the next spoil one-exchange ACCEPTs the engine reads into one naming a
// TGT that does not exist: what a dialer reads when the acceptor's TGT in
// its node died after the acceptor looked (see Endpoint.Dial).
type spoilReverse struct {
	kernel.Kernel
	spoil   atomic.Int32
	onSpoil func() // if set, called as the spoiled ACCEPT is read
}

func (s *spoilReverse) Event(ctx context.Context, id kernel.ID) (kernel.Event, error) {
	ev, err := s.Kernel.Event(ctx, id)
	var acc wire.Accept
	if err != nil || ev.Type != kernel.EventEstablished || ev.Exchange != kernel.ExchangeSIDR ||
		wire.DecodeAccept(ev.PrivateData, &acc) != nil || acc.Flags&wire.AcceptReverse == 0 || s.spoil.Load() <= 0 {
		return ev, err
	}
	s.spoil.Add(-1)
	if s.onSpoil != nil {
		s.onSpoil()
	}
	acc.Rev.TGTQPN = 0xFFFF00
	buf := make([]byte, wire.BudgetSIDRREP)
	n, err := acc.Encode(buf)
	ev.PrivateData = buf[:n]
	return ev, err
}

// A dial whose context ends just as it reads a one-exchange ACCEPT whose
// reverse leg it cannot take (its TGT gone: with time left it would ask
// again by two exchanges) fails with its context's error, as a dial that
// runs out of time anywhere else does. It failed with errReverseGone,
// which a caller cannot tell from anything: not a deadline, a refusal or
// a lost peer (found by cm's randomized dials with short deadlines under
// -race, 3 seeds in 150).
func TestOneExchangeDialEndsWithItsContext(t *testing.T) {
	w := newWorld(t)
	spoil := &spoilReverse{}
	a := w.wrappedEndpoint("10.0.8.1", 7000, func(k kernel.Kernel) kernel.Kernel { spoil.Kernel = k; return spoil })
	b := w.endpoint("10.0.8.2", 7000)
	keepA, keepB := pair(t, a, b) // live uplinks both ways: the dial asks for one exchange
	ctx, cancel := context.WithCancel(ctxT(t, 5*time.Second))
	defer cancel()
	spoil.onSpoil = cancel
	spoil.spoil.Store(1)
	_, err := a.Dial(ctx, b.Addr().String())
	if spoil.spoil.Load() != 0 {
		t.Fatal("the dial read no one-exchange ACCEPT to spoil")
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("dial: %v, want its context's error (context.Canceled)", err)
	}
	keepA.Close()
	keepB.Close()
	eventually(t, "legs released", func() (bool, string) {
		x, y := a.Stats(), b.Stats()
		return x.LocalCounts == 0 && y.LocalCounts == 0 && x.Conns == 0 && y.Conns == 0, fmt.Sprintf("a %+v b %+v", x, y)
	})
}

// A dial that abandons its one-exchange attempt (the reverse leg in the
// ACCEPT names a TGT that is gone) sends a FIN on its forward leg and asks
// again by two exchanges. The acceptor had bound its half: that half ends
// at the FIN, its first frame, and Accept never returns it. Accept returns
// the second attempt's connection only, which carries the message.
func TestOneExchangeAbandonedAttemptNotAccepted(t *testing.T) {
	w := newWorld(t)
	spoil := &spoilReverse{}
	a := w.wrappedEndpoint("10.0.8.1", 7000, func(k kernel.Kernel) kernel.Kernel { spoil.Kernel = k; return spoil })
	b := w.endpoint("10.0.8.2", 7000)
	keepA, keepB := pair(t, a, b) // live uplinks both ways, each with an open leg
	before := b.Stats()
	spoil.spoil.Store(1)
	type res struct {
		c   *Conn
		err error
	}
	accepted := make(chan res, 2)
	go func() {
		for {
			c, err := b.Accept(ctxT(t, 5*time.Second))
			accepted <- res{c, err}
			if err != nil {
				return
			}
		}
	}()
	c, err := a.Dial(ctxT(t, 5*time.Second), b.Addr().String())
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	if spoil.spoil.Load() != 0 {
		t.Fatal("the dial read no one-exchange ACCEPT to spoil")
	}
	if err := c.Send(ctxT(t, 5*time.Second), []byte("second attempt")); err != nil {
		t.Fatal(err)
	}
	r := <-accepted
	if r.err != nil {
		t.Fatalf("accept: %v", r.err)
	}
	buf := make([]byte, 64)
	n, err := r.c.Recv(ctxT(t, 5*time.Second), buf)
	if err != nil || string(buf[:n]) != "second attempt" {
		t.Fatalf("the accepted connection gave %q, %v; want the dial's message", buf[:n], err)
	}
	// The first attempt's FIN goes in the background: it may come after.
	eventually(t, "the first attempt abandoned at the acceptor", func() (bool, string) {
		s := b.Stats()
		return s.Abandoned == before.Abandoned+1, fmt.Sprintf("%d abandoned, want %d", s.Abandoned, before.Abandoned+1)
	})
	select {
	case r := <-accepted:
		t.Fatalf("a second connection accepted: %v, %v", r.c, r.err)
	case <-time.After(100 * time.Millisecond):
	}
	for _, x := range []*Conn{c, r.c, keepA, keepB} {
		x.Close()
	}
	eventually(t, "legs released", func() (bool, string) {
		x, y := a.Stats(), b.Stats()
		return x.LocalCounts == 0 && y.LocalCounts == 0 && x.Conns == 0 && y.Conns == 0, fmt.Sprintf("a %+v b %+v", x, y)
	})
}

// pollGate holds back PollSend itself while hold is set: completions stay
// unpolled, so the sends they are for keep their send-queue slots. parked
// (if set) is closed when a PollSend call first waits at the gate.
type pollGate struct {
	kernel.Kernel
	mu     sync.Mutex
	hold   chan struct{}
	parked chan struct{}
}

func (g *pollGate) PollSend(ctx context.Context, q kernel.QP, out []kernel.SendCompletion) (int, error) {
	g.mu.Lock()
	h := g.hold
	if h != nil && g.parked != nil {
		close(g.parked)
		g.parked = nil
	}
	g.mu.Unlock()
	if h != nil {
		select {
		case <-h:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return g.Kernel.PollSend(ctx, q, out)
}

func (g *pollGate) set(hold, parked chan struct{}) {
	g.mu.Lock()
	g.hold, g.parked = hold, parked
	g.mu.Unlock()
}

// A one-exchange dial posts its first frame on the forward leg (the
// acceptor's half is up at it) and waits for room if the INI's send queue is
// full. That wait honours the dial's context: with the queue held full (an
// INI stalled behind a receiver that stopped draining, which rnr_retry 7
// retries for ever) Dial returns at its deadline, and the attempt ends as an
// abandoned one (a FIN, posted once there is room, ends the acceptor's half,
// which Accept never returns). Before, the wait watched only the connection
// and the endpoint, and Dial waited past its deadline for as long as the
// queue stayed full.
func TestOneExchangeDialHonoursContext(t *testing.T) { dialHonoursContext(t, longTimers) }

// The same with keepalives due while the first frame waits for room: the
// janitor's keepalive for the dial's leg waits for room too, and was
// posted, once there was some, before the FIN of the attempt given up (in
// 7 to 9 rounds of 10), which the acceptor's half took for the dialer's
// first frame: Accept returned the abandoned attempt, which read EOF.
func TestOneExchangeAbandonedBeforeKeepaliveDue(t *testing.T) {
	beat := func(c *Config) { c.Heartbeat, c.IdleTimeout = 20*time.Millisecond, time.Hour }
	for i := range 3 { // the FIN and the keepalive race for the room
		t.Run(fmt.Sprint(i), func(t *testing.T) { dialHonoursContext(t, beat) })
	}
}

func dialHonoursContext(t *testing.T, timers func(*Config)) {
	w := newWorld(t)
	w.f.AddNode("10.0.62.1", memfabric.NodeConfig{SendQueueDepth: 1})
	g := &pollGate{}
	a := w.wrappedEndpoint("10.0.62.1", 7000, func(k kernel.Kernel) kernel.Kernel { g.Kernel = k; return g }, timers)
	b := w.endpoint("10.0.62.2", 7000, timers)
	c1, d1 := pair(t, a, b) // live uplinks both ways: a's next dial to b takes one exchange
	unpolled := func() int {
		a.mu.Lock()
		defer a.mu.Unlock()
		return len(a.uplinks[0].cur.waiters)
	}
	// c1's first frame goes as its Dial returns: its completion is polled
	// before the gate closes, or it holds the queue's one slot ("one"
	// below then waits for room for ever: 7 runs in 180 under load).
	eventually(t, "a's sends all polled", func() (bool, string) { n := unpolled(); return n == 0, fmt.Sprint(n) })
	hold, parked := make(chan struct{}), make(chan struct{})
	g.set(hold, parked)
	var once sync.Once
	release := func() { once.Do(func() { g.set(nil, nil); close(hold) }) }
	t.Cleanup(release) // before the endpoints close
	// The poller may be inside PollSend when the gate closes: a send's
	// completion wakes it, and it parks at the gate when it comes back. If
	// it took that completion, a second send takes the queue's one slot.
	sent := []string{"one"}
	if err := c1.Send(ctxT(t, time.Second), []byte("one")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-parked:
	case <-time.After(5 * time.Second):
		t.Fatal("setup: the send poller never came back to the gate")
	}
	if unpolled() == 0 {
		// With keepalives due (TestOneExchangeAbandonedBeforeKeepaliveDue)
		// one may take the slot first: "two" then waits for room, which
		// the gate keeps from coming, and is not sent.
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c1.Send(ctx, []byte("two"))
		cancel()
		switch {
		case err == nil:
			sent = append(sent, "two")
		case errors.Is(err, context.DeadlineExceeded) && unpolled() == 1:
		default:
			t.Fatal(err)
		}
	}
	if n := unpolled(); n != 1 {
		t.Fatalf("setup: %d sends wait for their completions, want 1 (the queue's one slot)", n)
	}
	sa, sb := a.Stats(), b.Stats()
	accepted := make(chan *Conn, 1)
	go func() {
		if c, err := b.Accept(ctxT(t, 10*time.Second)); err == nil {
			accepted <- c
		}
	}()
	done := make(chan error, 1)
	go func() {
		_, err := a.Dial(ctxT(t, 200*time.Millisecond), b.Addr().String())
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("dial: %v, want its deadline", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Dial with a 200 ms deadline still waits after 5 s for room for its first frame")
	}
	if s := a.Stats(); s.OneExchange != sa.OneExchange+1 || s.SendQueueFull == sa.SendQueueFull {
		t.Fatalf("the dial should have registered its reverse leg and found the send queue full: %+v (was %+v)", s, sa)
	}
	release()
	eventually(t, "the attempt abandoned at the acceptor, and both sides' halves released", func() (bool, string) {
		x, y := a.Stats(), b.Stats()
		return y.Abandoned == sb.Abandoned+1 && x.Conns == sa.Conns && y.Conns == sb.Conns && x.LocalCounts == sa.LocalCounts &&
			y.LocalCounts == sb.LocalCounts, fmt.Sprintf("a %+v (was %+v), b %+v (was %+v)", x, sa, y, sb)
	})
	select {
	case c := <-accepted:
		t.Fatalf("Accept returned the abandoned attempt's connection from %v", c.RemoteAddr())
	default:
	}
	buf := make([]byte, 64)
	for _, m := range sent {
		if n, err := d1.Recv(ctxT(t, 5*time.Second), buf); err != nil || string(buf[:n]) != m {
			t.Fatalf("the first connection gave %q, %v; want %q", buf[:n], err, m)
		}
	}
	roundTrip(t, c1, d1, []byte("the first connection is unaffected"))
}

// A MOVE of a leg the receiver does not hold is refused BUSY_RETRY, not
// BAD_REQUEST, while the receiver has a dial to the sender's node whose
// ACCEPT it has not read: the leg may be that ACCEPT's reverse leg, which
// its sender bound at once and its recovery moved before the receiver
// registered it (see Endpoint.onRequest); refused for good, the sender
// would fail the connection. A fake acceptor holds the dial's VIRT_REQ
// unanswered, so the ACCEPT stays unread for as long as the test needs.
// From another node, or once the ACCEPT is read (a plain one: the dial
// then waits for the reciprocal leg), the same MOVE is BAD_REQUEST;
// nothing is made either way.
func TestOneExchangeUnknownMoveWhileAcceptUnread(t *testing.T) {
	w := newWorld(t)
	a := w.endpoint("10.0.65.1", 7000)
	b := w.endpoint("10.0.65.2", 7000)
	pair(t, a, b) // a's uplink to node B: a's dials there are VIRT_REQs with ONE_EXCHANGE
	k, kc := w.rawKernel("10.0.65.2"), w.rawKernel("10.0.65.3")
	fake := netip.MustParseAddrPort("10.0.65.2:7100")
	l, err := k.Listen(fake, kernel.ExchangeSIDR)
	if err != nil {
		t.Fatal(err)
	}
	move := encodeReq(t, wire.Req{Type: wire.TypeVirtReq, Flags: wire.FlagMove, Move: 1, ConnTag: 77, Incarnation: 0xE71,
		INIQPN: 0x100, TGTQPNHint: 0x100, DomainHint: a.dom.ID, SRQN: 0x30, ReplyPort: 9, Credits: 8, MaxMessage: MaxMessageSize})
	moveAnswer := func(from kernel.Kernel) wire.RejectReason {
		t.Helper()
		ev := answer(t, from, a.Addr(), kernel.ExchangeSIDR, 0, move)
		var rej wire.Reject
		if ev.Type != kernel.EventUnreachable || wire.DecodeReject(ev.PrivateData, &rej) != nil {
			t.Fatalf("MOVE of an unknown leg answered %v %x, want a REJECT", ev.Type, ev.PrivateData)
		}
		return rej.Reason
	}
	before := a.Stats()
	if r := moveAnswer(k); r != wire.RejectBadRequest {
		t.Fatalf("no dial pending: %v, want BAD_REQUEST", r)
	}
	dialed := make(chan error, 1)
	dialCtx, cancelDial := context.WithCancel(ctxT(t, 5*time.Second))
	defer cancelDial()
	go func() {
		_, err := a.Dial(dialCtx, fake.String())
		dialed <- err
	}()
	id, req := heldOneExchangeReq(t, k, l) // held: a has not read its ACCEPT
	if r := moveAnswer(k); r != wire.RejectBusyRetry {
		t.Fatalf("from the dial's node, its ACCEPT unread: %v, want BUSY_RETRY", r)
	}
	if r := moveAnswer(kc); r != wire.RejectBadRequest {
		t.Fatalf("from another node: %v, want BAD_REQUEST", r)
	}
	// A plain ACCEPT: a reads it, and its dial waits for the reciprocal
	// leg, still pending, with no reverse leg in an ACCEPT to come.
	m := wire.Accept{TagEcho: req.ConnTag, AcceptorTag: 99, Incarnation: 0xFA6E, TGTQPN: req.TGTQPNHint, SRQN: b.srqn,
		DomainID: req.DomainHint, Credits: 8, MaxMessage: MaxMessageSize}
	buf := make([]byte, wire.BudgetSIDRREP)
	n, err := m.Encode(buf)
	if err != nil {
		t.Fatal(err)
	}
	if err := k.Accept(id, req.TGTQPNHint, buf[:n]); err != nil {
		t.Fatal(err)
	}
	k.DestroyID(id)
	eventually(t, "a read the ACCEPT; its dial waits for the reciprocal leg", func() (bool, string) {
		a.mu.Lock()
		defer a.mu.Unlock()
		for _, c := range a.pending {
			if c.raddr == fake {
				return c.sendUp && c.earlyTag == 0, fmt.Sprintf("sendUp %v, earlyTag %#x", c.sendUp, c.earlyTag)
			}
		}
		return false, "no dial pending"
	})
	if r := moveAnswer(k); r != wire.RejectBadRequest {
		t.Fatalf("the dial's ACCEPT read: %v, want BAD_REQUEST", r)
	}
	cancelDial()
	if err := <-dialed; !errors.Is(err, context.Canceled) {
		t.Fatalf("dial: %v, want it cancelled", err)
	}
	eventually(t, "a as it was", func() (bool, string) {
		s := a.Stats()
		ok := s.Downlinks == before.Downlinks && s.LocalCounts == before.LocalCounts && s.Conns == before.Conns &&
			s.KernelHandles == before.KernelHandles && s.Rejected == before.Rejected+4
		return ok, fmt.Sprintf("%+v (was %+v)", s, before)
	})
}

// The same MOVE, when the dialer reads its ACCEPT, and registers the
// reverse leg the ACCEPT carries, after the acceptor decided that it does
// not hold the leg and before onRequest looks for a dial whose ACCEPT is
// unread: that dial was no longer unread, and the MOVE was refused
// BAD_REQUEST. The sender's recovery then failed its connection, and the
// dialer's with it (a Dial between two live processes refused BAD_REQUEST,
// or a connection whose peer's FIN never came, silent until the idle
// timeout: TestEndpointManyDialsKilledThreeNodes, about 1 run in 100 on a
// loaded host). It is BUSY_RETRY, and asked again the MOVE is accepted. A
// fake acceptor answers the dial, with a reverse leg on b's uplink to a's
// node, in that window (testAfterDecide).
func TestOneExchangeUnknownMoveAcceptReadMeanwhile(t *testing.T) {
	w := newWorld(t)
	a := w.endpoint("10.0.66.1", 7000)
	b := w.endpoint("10.0.66.2", 7000)
	pair(t, a, b) // uplinks both ways: a's dials to node B ask for a reverse leg in their ACCEPT
	b.mu.Lock()
	var ini, tgt uint32
	for _, u := range b.uplinks {
		if u.node == a.Addr().Addr() && u.cur != nil {
			ini, tgt = u.cur.num, u.cur.tgt
		}
	}
	b.mu.Unlock()
	if tgt == 0 {
		t.Fatal("setup: b has no uplink to a's node")
	}
	k := w.rawKernel("10.0.66.2")
	fake := netip.MustParseAddrPort("10.0.66.2:7100")
	l, err := k.Listen(fake, kernel.ExchangeSIDR)
	if err != nil {
		t.Fatal(err)
	}
	const revTag = 77
	move := encodeReq(t, wire.Req{Type: wire.TypeVirtReq, Flags: wire.FlagMove, Move: 1, ConnTag: revTag, Incarnation: b.inc,
		INIQPN: ini, TGTQPNHint: tgt, DomainHint: a.dom.ID, SRQN: b.srqn, ReplyPort: fake.Port(), Credits: 8, MaxMessage: MaxMessageSize})
	moveAnswer := func() kernel.Event {
		t.Helper()
		return answer(t, k, a.Addr(), kernel.ExchangeSIDR, 0, move)
	}
	before := a.Stats()
	dialed := make(chan error, 1)
	go func() {
		c, err := a.Dial(ctxT(t, 5*time.Second), fake.String())
		if err == nil {
			c.Close()
		}
		dialed <- err
	}()
	id, req := heldOneExchangeReq(t, k, l) // held: a has not read its ACCEPT
	var once sync.Once
	var hookErr error
	hook := func(d decision) {
		if !d.UnknownMove {
			return
		}
		once.Do(func() {
			// The ACCEPT, with the reverse leg on b's uplink to a's node
			// (its INI, its TGT there: a verifies both), goes now.
			m := wire.Accept{TagEcho: req.ConnTag, AcceptorTag: 99, Incarnation: b.inc, TGTQPN: req.TGTQPNHint, SRQN: b.srqn,
				DomainID: req.DomainHint, Credits: 8, MaxMessage: MaxMessageSize, Flags: wire.AcceptReverse,
				Rev: wire.Reverse{Tag: revTag, INIQPN: ini, TGTQPN: tgt, DomainID: a.dom.ID}}
			buf := make([]byte, wire.BudgetSIDRREP)
			n, err := m.Encode(buf)
			if err == nil {
				err = k.Accept(id, req.TGTQPNHint, buf[:n])
			}
			k.DestroyID(id)
			if err != nil {
				hookErr = err
				return
			}
			deadline := time.Now().Add(time.Second)
			for a.readingAcceptFrom(fake.Addr()) || !a.acc.Holds(legKey{b.inc, revTag}) {
				if time.Now().After(deadline) {
					hookErr = errors.New("a never registered the reverse leg")
					return
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
	a.testAfterDecide.Store(&hook)
	defer a.testAfterDecide.Store(nil)
	ev := answer(t, k, a.Addr(), kernel.ExchangeSIDR, 0, move)
	if hookErr != nil {
		t.Fatal(hookErr)
	}
	var rej wire.Reject
	if ev.Type != kernel.EventUnreachable || wire.DecodeReject(ev.PrivateData, &rej) != nil || rej.Reason != wire.RejectBusyRetry {
		t.Fatalf("MOVE of the reverse leg registered after the decision: answered %v %v, want BUSY_RETRY", ev.Type, rej.Reason)
	}
	var acc wire.Accept
	if ev := moveAnswer(); ev.Type != kernel.EventEstablished || wire.DecodeAccept(ev.PrivateData, &acc) != nil || acc.TGTQPN != tgt {
		t.Fatalf("the same MOVE asked again: %v %+v, want it accepted onto TGT %d", ev.Type, acc, tgt)
	}
	if err := <-dialed; err != nil {
		t.Fatalf("dial: %v", err)
	}
	eventually(t, "a as it was", func() (bool, string) {
		s := a.Stats()
		ok := s.Downlinks == before.Downlinks && s.LocalCounts == before.LocalCounts && s.Conns == before.Conns &&
			s.KernelHandles == before.KernelHandles
		return ok, fmt.Sprintf("%+v (was %+v)", s, before)
	})
}
