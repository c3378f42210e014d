package xrc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/xrc/internal/wire"
)

// stallMoves holds every MOVE request (PHYS or VIRT) that reaches this
// process's listeners until release is closed or ctx ends: a process that
// is alive (its TGT handle, SRQ and keepalives are fine) but slow to answer
// its CM events (stopped in a debugger, starved, paused).
type stallMoves struct {
	kernel.Kernel
	release chan struct{}
}

func (g *stallMoves) Event(ctx context.Context, id kernel.ID) (kernel.Event, error) {
	ev, err := g.Kernel.Event(ctx, id)
	if err == nil && isMoveRequest(ev) {
		select {
		case <-g.release:
		case <-ctx.Done():
		}
	}
	return ev, err
}

// isMoveRequest reports whether ev is a PHYS_REQ or VIRT_REQ flagged MOVE.
func isMoveRequest(ev kernel.Event) bool {
	if ev.Type != kernel.EventConnectRequest {
		return false
	}
	var req wire.Req
	want := wire.TypePhysReq
	if ev.Exchange == kernel.ExchangeSIDR {
		want = wire.TypeVirtReq
	}
	return wire.DecodeReq(ev.PrivateData, want, &req) == nil && req.Flags&wire.FlagMove != 0
}

// slowMove is a sender s on node NET.1 with a leg to each of three
// receivers on node NET.2, paired in tag order: r1, whose MOVE requests
// wait until g.release is closed (alive, but slow to answer its CM events),
// so its leg moves first; r2, healthy; r3, which recover kills.
type slowMove struct {
	s, r1, r2, r3 *proc
	g             *stallMoves
	s2, c2, s3    *Conn
}

func newSlowMove(t *testing.T, w *world, net string, sender, receivers []func(*Config)) *slowMove {
	t.Helper()
	m := &slowMove{g: &stallMoves{release: make(chan struct{})}}
	m.s = w.endpoint(net+".1", 7000, sender...)
	countedTags(m.s.Endpoint)
	m.r1 = w.wrappedEndpoint(net+".2", 7001, func(k kernel.Kernel) kernel.Kernel { m.g.Kernel = k; return m.g }, receivers...)
	m.r2 = w.endpoint(net+".2", 7002, receivers...)
	m.r3 = w.endpoint(net+".2", 7003, receivers...)
	pair(t, m.s, m.r1)
	m.s2, m.c2 = pair(t, m.s, m.r2)
	m.s3, _ = pair(t, m.s, m.r3)
	return m
}

// recover kills r3: a send to its dead SRQ fails the INI, and the sender
// recovers its uplink to the node.
func (m *slowMove) recover(t *testing.T) {
	t.Helper()
	m.r3.p.Kill()
	if err := sendErr(t, m.s3); !errors.Is(err, ErrPeerGone) {
		t.Fatalf("to the dead: %v", err)
	}
}

// One slow receiver on a node must not make a sender's recovery fail every
// other connection to that node. It did: the recovery's single deadline was
// spent on the first leg's PHYS_REQ, and every later leg then "failed to
// move" at once. Each MOVE has its own deadline now.
func TestRecoveryOneSlowReceiverFailsNoOther(t *testing.T) {
	hs := func(c *Config) { longTimers(c); c.HandshakeTimeout = time.Second }
	m := newSlowMove(t, newWorld(t), "10.0.70", []func(*Config){hs}, []func(*Config){longTimers})
	defer close(m.g.release)
	m.recover(t)
	// r1 is slow, not dead; r2 is healthy and must keep its connection.
	ctx := ctxT(t, 5*time.Second)
	if err := m.s2.Send(ctx, []byte("to r2")); err != nil {
		t.Fatalf("send to healthy r2 after the recovery: %v (sender %+v)", err, m.s.Stats())
	}
	buf := make([]byte, 16)
	if _, err := m.c2.Recv(ctx, buf); err != nil {
		t.Fatalf("r2 recv: %v", err)
	}
	// The first send may have been taken before the failure surfaced.
	time.Sleep(100 * time.Millisecond)
	if err := m.s2.Send(ctx, []byte("again")); err != nil {
		t.Fatalf("second send to healthy r2: %v (sender %+v)", err, m.s.Stats())
	}
}

// The same with a receiver that answers after 2 s, well within the
// handshake timeout: the sender's recovery sends nothing on any leg to the
// node meanwhile (no keepalives), so the healthy receiver r2 took its sender
// for dead after its idle timeout (1 s here). A MOVE now waits at most half
// the idle timeout, and the other legs move in parallel once the new INI is
// up.
func TestRecoverySlowReceiverIdlesNoOther(t *testing.T) {
	m := newSlowMove(t, newWorld(t), "10.0.71", nil, nil)
	time.AfterFunc(2*time.Second, func() { close(m.g.release) })
	m.recover(t)
	ctx := ctxT(t, 8*time.Second)
	for i := range 3 {
		if err := m.s2.Send(ctx, []byte("to r2")); err != nil {
			t.Fatalf("send %d to healthy r2: %v (sender %+v, r2 %+v)", i, err, m.s.Stats(), m.r2.Stats())
		}
		if _, err := m.c2.Recv(ctx, make([]byte, 16)); err != nil {
			t.Fatalf("r2 recv %d: %v", i, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A second Close made while the first is still running returns only once
// everything is released (it returned at once, with the port still bound).
func TestEndpointConcurrentCloseWaits(t *testing.T) {
	w := newWorld(t)
	s := w.endpoint("10.0.72.1", 7000)
	g := &stallMoves{release: make(chan struct{})}
	defer close(g.release)
	r1 := w.wrappedEndpoint("10.0.72.2", 7001, func(k kernel.Kernel) kernel.Kernel { g.Kernel = k; return g })
	r3 := w.endpoint("10.0.72.2", 7003)
	pair(t, s, r1)
	s3, _ := pair(t, s, r3)
	r3.p.Kill()
	if err := sendErr(t, s3); !errors.Is(err, ErrPeerGone) {
		t.Fatalf("to the dead: %v", err)
	}
	// s's uplink to 10.0.72.2 is RECOVERING (r1 does not answer yet).
	first := make(chan time.Duration, 1)
	start := time.Now()
	go func() { s.Close(); first <- time.Since(start) }()
	eventually(t, "first Close under way", func() (bool, string) {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.closed, ""
	})
	s.Close()
	second := time.Since(start)
	h := s.Stats().KernelHandles
	e2, err := newEndpoint(context.Background(), s.k, Config{Addr: s.Addr().String(), DomainDir: w.dirs["10.0.72.1"]})
	if err == nil {
		defer e2.Close()
	}
	t.Logf("second Close returned after %v with %d kernel handles still held; first Close took %v; reopening the port: %v", second, h, <-first, err)
	if h != 0 || err != nil {
		t.Fatalf("second Close returned before the endpoint was released")
	}
}

// Endpoint.Close that overlaps an uplink's recovery: the recovery finishes
// (resends, then UP), so the FINs Close's connections wait to send go, and
// the healthy peer r2 gets the message sent before Close, then EOF. The
// recovery used to end the uplink (NONE) on seeing closed: no FIN went, and
// r2's Recv failed with ErrPeerGone at its idle timeout.
func TestEndpointCloseDuringRecoverySendsFIN(t *testing.T) {
	m := newSlowMove(t, newWorld(t), "10.0.74", nil, nil)
	if err := m.s2.Send(ctxT(t, 5*time.Second), []byte("last words")); err != nil {
		t.Fatal(err)
	}
	m.recover(t)
	// The recovery is under way; r1 answers its MOVE 300 ms from now.
	time.AfterFunc(300*time.Millisecond, func() { close(m.g.release) })
	start := time.Now()
	m.s.Close()
	t.Logf("s.Close took %v", time.Since(start))
	buf := make([]byte, 32)
	n, err := m.c2.Recv(ctxT(t, 5*time.Second), buf)
	if err != nil {
		t.Fatalf("r2: the message sent before Close: %v after %v", err, time.Since(start))
	}
	if _, err := m.c2.Recv(ctxT(t, 5*time.Second), buf); err != io.EOF {
		t.Fatalf("r2 after %q: %v after %v, want io.EOF", buf[:n], err, time.Since(start))
	}
}

// connErr is c's failure, or nil.
func connErr(c *Conn) error {
	c.e.mu.Lock()
	defer c.e.mu.Unlock()
	return c.err
}

// A recovery brings the uplink up once the new INI is, and each other leg
// resumes when its own MOVE is answered: the healthy receivers' traffic
// does not wait for stalled receivers' VIRT_REQs. It did: the uplink came
// up only once every MOVE was answered or timed out, so two stalled
// receivers (r1 with two legs, r5 with one) held back the healthy r2 and r4
// for the whole budget, here 30 s, and at the receivers' usual timers for
// an idle timeout. The stalled legs post nothing until their own MOVE is
// answered, then send what waited, in order.
func TestRecoveryStalledVirtReqsHoldUpNoOther(t *testing.T) {
	w := newWorld(t)
	hs := func(c *Config) { longTimers(c); c.HandshakeTimeout = 30 * time.Second }
	s := w.endpoint("10.0.75.1", 7000, hs)
	countedTags(s.Endpoint)
	g1 := &stallMoves{release: make(chan struct{})}
	g5 := &stallMoves{release: make(chan struct{})}
	r2 := w.endpoint("10.0.75.2", 7002, longTimers)
	r1 := w.wrappedEndpoint("10.0.75.2", 7001, func(k kernel.Kernel) kernel.Kernel { g1.Kernel = k; return g1 }, longTimers)
	r5 := w.wrappedEndpoint("10.0.75.2", 7005, func(k kernel.Kernel) kernel.Kernel { g5.Kernel = k; return g5 }, longTimers)
	r4 := w.endpoint("10.0.75.2", 7004, longTimers)
	r3 := w.endpoint("10.0.75.2", 7003, longTimers)
	s2, c2 := pair(t, s, r2) // the lowest tag: its PHYS_REQ makes the new INI
	s1a, c1a := pair(t, s, r1)
	s1b, c1b := pair(t, s, r1)
	s5, c5 := pair(t, s, r5)
	s4, c4 := pair(t, s, r4)
	s3, _ := pair(t, s, r3)
	released := false
	release := func() {
		if !released {
			released = true
			close(g1.release)
			close(g5.release)
		}
	}
	defer release()
	r3.p.Kill()
	if err := sendErr(t, s3); !errors.Is(err, ErrPeerGone) {
		t.Fatalf("to the dead: %v", err)
	}
	// Messages to the stalled receivers wait while their legs move.
	sent := make(chan error, 3)
	for _, c := range []*Conn{s1a, s1b, s5} {
		go func() { sent <- c.Send(ctxT(t, 20*time.Second), []byte("held")) }()
	}
	ctx := ctxT(t, 5*time.Second)
	for i := range 3 {
		for _, p := range []struct {
			name string
			s, c *Conn
		}{{"r2", s2, c2}, {"r4", s4, c4}} {
			if err := p.s.Send(ctx, []byte("to "+p.name)); err != nil {
				t.Fatalf("send %d to healthy %s while r1 and r5 stall: %v (sender %+v)", i, p.name, err, s.Stats())
			}
			if _, err := p.c.Recv(ctx, make([]byte, 16)); err != nil {
				t.Fatalf("%s recv %d while r1 and r5 stall: %v (sender %+v)", p.name, i, err, s.Stats())
			}
		}
	}
	for _, c := range []*Conn{s1a, s1b, s5} {
		if err := connErr(c); err != nil {
			t.Fatalf("a stalled receiver's leg failed before its MOVE's deadline: %v", err)
		}
	}
	select {
	case err := <-sent:
		t.Fatalf("a send on a leg whose MOVE is unanswered returned %v before the MOVE", err)
	default:
	}
	release()
	for i := range 3 {
		if err := <-sent; err != nil {
			t.Fatalf("send %d to a stalled receiver, once it answered: %v", i, err)
		}
	}
	for _, c := range []*Conn{c1a, c1b, c5} {
		buf := make([]byte, 16)
		n, err := c.Recv(ctx, buf)
		if err != nil || string(buf[:n]) != "held" {
			t.Fatalf("stalled receiver, once it answered: %q, %v", buf[:n], err)
		}
	}
	roundTrip(t, s1b, c1b, []byte("after"))
	roundTrip(t, s2, c2, []byte("after"))
}

// The same with a stalled receiver r1 whose two legs sort first: its first
// leg's PHYS_REQ times out (the MOVE's budget, 2 s here), its second leg
// waits for a VIRT_REQ, and the healthy r2's PHYS_REQ makes the new INI.
// r2's traffic resumes at once, while r1's second MOVE is still under way.
// It did not: the uplink came up only after that VIRT_REQ timed out too, so
// r2 heard nothing for two budgets, a whole idle timeout at the usual
// timers (the test this replaces, which idled r2 out, passed about half
// the time).
func TestRecoverySlowReceiverWithLegsIdlesNoOther(t *testing.T) {
	w := newWorld(t)
	hs := func(c *Config) { longTimers(c); c.HandshakeTimeout = 2 * time.Second }
	g := &stallMoves{release: make(chan struct{})}
	defer close(g.release)
	s := w.endpoint("10.0.76.1", 7000, hs)
	countedTags(s.Endpoint)
	r1 := w.wrappedEndpoint("10.0.76.2", 7001, func(k kernel.Kernel) kernel.Kernel { g.Kernel = k; return g }, longTimers)
	r2, r3 := w.endpoint("10.0.76.2", 7002, longTimers), w.endpoint("10.0.76.2", 7003, longTimers)
	s1a, _ := pair(t, s, r1) // the lowest tags: tried first
	s1b, _ := pair(t, s, r1)
	s2, c2 := pair(t, s, r2)
	s3, _ := pair(t, s, r3)
	r3.p.Kill()
	if err := sendErr(t, s3); !errors.Is(err, ErrPeerGone) {
		t.Fatalf("to the dead: %v", err)
	}
	ctx := ctxT(t, 8*time.Second)
	if err := s2.Send(ctx, []byte("to r2")); err != nil {
		t.Fatalf("send to healthy r2: %v (sender %+v)", err, s.Stats())
	}
	if _, err := c2.Recv(ctx, make([]byte, 16)); err != nil {
		t.Fatalf("r2 recv: %v (sender %+v)", err, s.Stats())
	}
	if err := connErr(s1b); err != nil {
		t.Fatalf("r2 heard from us only once r1's second MOVE had failed (%v): r2 waited for it", err)
	}
	if err := connErr(s1a); !errors.Is(err, ErrPeerGone) {
		t.Fatalf("r1's first leg, whose PHYS_REQ timed out: %v, want ErrPeerGone", err)
	}
	roundTrip(t, s2, c2, []byte("again"))
}

// holdPolls holds the receive loop's polls, once hold is set, until
// release is closed: a receive loop that has not run yet, with messages
// waiting in the SRQ. A poll's deadline passing meanwhile is no drain: the
// poll waits on.
type holdPolls struct {
	kernel.Kernel
	hold    atomic.Bool
	holding chan struct{} // closed when a poll is held
	once    sync.Once
	release chan struct{}
}

func (h *holdPolls) PollRecv(ctx context.Context, s kernel.SRQ, out []kernel.RecvCompletion) (int, error) {
	if h.hold.Load() {
		h.once.Do(func() { close(h.holding) })
		select {
		case <-h.release:
		case <-ctx.Done():
			if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return 0, ctx.Err() // kicked, or the endpoint closed
			}
			<-h.release
		}
		if ctx.Err() != nil {
			short, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
			defer cancel()
			ctx = short
		}
	}
	return h.Kernel.PollRecv(ctx, s, out)
}

// A peer that sends, closes its connection and then its endpoint while its
// last messages and FIN wait in our SRQ, not yet polled, and our next post
// (a keepalive) tells us its receive queue is gone. That failed the
// connection at once, releasing its receiving leg, so the waiting messages
// were dropped and Recv failed. Now only the sending leg ends: the
// connection fails once a poll begun after that finds the SRQ empty, and
// here the FIN ends it first: every message, then io.EOF. (A peer killed,
// with no FIN, still fails at once: TestEndpointDialAfterTGTGone.)
//
// "TGT gone": the peer's last handle on the TGT our INI reached went with
// its endpoint; the post finds the INI failed, and the recovery's MOVE of
// our sending leg is refused NO_LISTENER (cm's
// TestFabricNetConnConformance/BasicIO, once in a CI run). "TGT shared":
// another process of the peer's node holds the TGT, so the post itself
// completes with "remote invalid request" (found by a review); the other
// process's connection goes on. "port taken": a new process has the peer's
// port by the time the MOVE comes, and refuses it (BAD_REQUEST: it does not
// know the leg; found by a review).
func TestPeerGoneWithFINQueuedEndsGracefully(t *testing.T) {
	for _, how := range []string{"TGT gone", "TGT shared", "port taken"} {
		t.Run(how, func(t *testing.T) { testPeerGoneWithFINQueued(t, how) })
	}
}

func testPeerGoneWithFINQueued(t *testing.T, how string) {
	shared := how == "TGT shared"
	w := newWorld(t)
	hb := 20 * time.Millisecond
	if how == "port taken" {
		hb = 300 * time.Millisecond // the new process listens before our next keepalive
	}
	beat := func(c *Config) { c.Heartbeat, c.IdleTimeout = hb, 10*time.Second }
	h := &holdPolls{holding: make(chan struct{}), release: make(chan struct{})}
	released := false
	release := func() {
		if !released {
			released = true
			close(h.release)
		}
	}
	defer release()
	s := w.wrappedEndpoint("10.0.77.1", 7000, func(k kernel.Kernel) kernel.Kernel { h.Kernel = k; return h }, beat)
	c := w.endpoint("10.0.77.2", 7001, beat)
	cs, sc := pair(t, c, s)
	var cs2, sc2 *Conn
	if shared {
		cs2, sc2 = pair(t, w.endpoint("10.0.77.2", 7002, beat), s) // the same node: the same TGT
		roundTrip(t, sc2, cs2, []byte("shared"))
	}
	ctx := ctxT(t, 10*time.Second)
	h.hold.Store(true)
	s.kickPoll() // the poll under way ends; the next one is held
	<-h.holding
	const n = 5
	if err := sendSeq(ctx, cs, 0, n); err != nil {
		t.Fatal(err)
	}
	cs.Close()
	c.Close()
	if how == "port taken" {
		w.endpoint("10.0.77.2", 7001, beat)
	}
	eventually(t, "the receiver's recovery of its uplink to the closed endpoint", func() (bool, string) {
		st := s.Stats()
		return st.Recoveries > 0 && (shared || st.Uplinks == 0), fmt.Sprintf("%+v", st)
	})
	if err := connErr(sc); err != nil {
		t.Fatalf("failed before its SRQ was polled: %v", err)
	}
	err := sc.Send(ctx, []byte("to the gone"))
	if !errors.Is(err, ErrPeerGone) {
		t.Fatalf("send on the ended sending leg: %v, want ErrPeerGone", err)
	}
	if how == "port taken" && !strings.Contains(err.Error(), "BAD_REQUEST") {
		t.Fatalf("send on the ended sending leg: %v, want the new process's refusal", err)
	}
	release()
	if err := recvSeq(ctx, sc, 0, n, nil); err != nil {
		t.Fatalf("the messages queued before the peer's FIN: %v", err)
	}
	if _, err := sc.Recv(ctx, make([]byte, 64)); err != io.EOF {
		t.Fatalf("after them: %v, want io.EOF", err)
	}
	if shared {
		roundTrip(t, sc2, cs2, []byte("the sharer's connection goes on"))
	}
}

// TestPausedReceiverKeepsQueuedFIN is TestPeerGoneWithFINQueuedEndsGracefully
// with memfabric's PauseReceives in place of a held poll: a stalled receiver
// whose peer's messages and FIN wait on its SRQ must not take a poll that
// ran out of time for a drain. The model's paused poll returned its
// deadline's error, which says the SRQ was found empty, and the connection
// failed with the data unread (found by review).
func TestPausedReceiverKeepsQueuedFIN(t *testing.T) {
	w := newWorld(t)
	beat := func(c *Config) { c.Heartbeat, c.IdleTimeout = 20*time.Millisecond, 10*time.Second }
	s := w.endpoint("10.0.77.1", 7000, beat)
	c := w.endpoint("10.0.77.2", 7001, beat)
	cs, sc := pair(t, c, s)
	ctx := ctxT(t, 10*time.Second)
	s.p.PauseReceives()
	const n = 5
	if err := sendSeq(ctx, cs, 0, n); err != nil {
		t.Fatal(err)
	}
	cs.Close()
	c.Close()
	eventually(t, "the receiver's recovery of its uplink to the closed endpoint", func() (bool, string) {
		st := s.Stats()
		return st.Recoveries > 0 && st.Uplinks == 0, fmt.Sprintf("%+v", st)
	})
	if err := sc.Send(ctx, []byte("to the gone")); !errors.Is(err, ErrPeerGone) {
		t.Fatalf("send on the ended sending leg: %v, want ErrPeerGone", err)
	}
	time.Sleep(100 * time.Millisecond) // a stalled process: some polls' time
	if err := connErr(sc); err != nil {
		t.Errorf("failed while its peer's messages and FIN sat unpolled in the SRQ: %v", err)
	}
	s.p.ResumeReceives()
	if err := recvSeq(ctx, sc, 0, n, nil); err != nil {
		t.Fatalf("the messages queued before the peer's FIN: %v", err)
	}
	if _, err := sc.Recv(ctx, make([]byte, 64)); err != io.EOF {
		t.Fatalf("after them: %v, want io.EOF", err)
	}
}

// The same pause, then the endpoint closed while a poll with a deadline
// finds the SRQ held: Close returns. The first fix of the test above held
// such a poll until ResumeReceives, which no longer saw the endpoint's
// cancel, and Close waited for ever (found by review); the model's poll now
// returns EINTR, which the receive loop takes for no drain.
func TestCloseWhilePausedWithQueuedMessages(t *testing.T) {
	w := newWorld(t)
	a := w.endpoint("10.0.78.1", 7000, longTimers)
	b := w.endpoint("10.0.78.2", 7000, longTimers)
	ca, cb := pair(t, a, b)
	roundTrip(t, ca, cb, []byte("hello"))
	roundTrip(t, cb, ca, []byte("back"))
	ctx := ctxT(t, 10*time.Second)
	b.p.PauseReceives()
	defer b.p.ResumeReceives()
	if err := ca.Send(ctx, []byte("queued")); err != nil {
		t.Fatal(err)
	}
	a.Close()
	// Our sending leg ends (sendGone): the next polls have a deadline.
	serr := sendErr(t, cb)
	t.Logf("cb's Send after a's Close: %v", serr)
	if !errors.Is(serr, ErrPeerGone) {
		t.Fatalf("cb's Send after a's Close: %v, want ErrPeerGone (nil: the sending leg never ended)", serr)
	}
	time.Sleep(200 * time.Millisecond) // past lingerPoll: polls end at their deadlines, the SRQ held
	if err := connErr(cb); err != nil {
		t.Errorf("failed while the peer's message and FIN sat unpolled: %v", err)
	}
	done := make(chan struct{})
	go func() { b.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(3 * time.Second):
		t.Fatal("Endpoint.Close of a process whose receives are paused, with a message queued, has not returned in 3 s")
	}
}
