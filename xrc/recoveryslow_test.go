package xrc

import (
	"context"
	"errors"
	"io"
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
	if err == nil && ev.Type == kernel.EventConnectRequest {
		var req wire.Req
		want := wire.TypePhysReq
		if ev.Exchange == kernel.ExchangeSIDR {
			want = wire.TypeVirtReq
		}
		if wire.DecodeReq(ev.PrivateData, want, &req) == nil && req.Flags&wire.FlagMove != 0 {
			select {
			case <-g.release:
			case <-ctx.Done():
			}
		}
	}
	return ev, err
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
