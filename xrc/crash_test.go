package xrc

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/verbs"
	"github.com/goxrc/goxrc/xrc/internal/wire"
)

// talkUntil exchanges messages both ways between s and c until done holds
// (for at least two heartbeats, at most 5 s), checking each one.
func talkUntil(t *testing.T, s, c *Conn, name string, done func() bool) {
	t.Helper()
	start := time.Now()
	for i := 0; ; i++ {
		roundTrip(t, s, c, fmt.Appendf(nil, "to %s %d", name, i))
		roundTrip(t, c, s, fmt.Appendf(nil, "from %s %d", name, i))
		if time.Since(start) > 2*testHeartbeat && done() {
			return
		}
		if time.Since(start) > 5*time.Second {
			t.Fatalf("not done after 5 s of traffic with %s", name)
		}
		time.Sleep(time.Millisecond)
	}
}

// longTimers turns crash detection off for the duration of a test.
func longTimers(c *Config) { c.Heartbeat, c.IdleTimeout = time.Hour, 2*time.Hour }

// The TGT's creator dies (kill -9) while another process on its node shares
// the TGT: the sharer keeps receiving from the sender and sending to it; the
// sender's connection to the dead process fails; everything held for the
// dead process is released on both nodes.
func TestEndpointKillTGTCreator(t *testing.T) {
	w := newWorld(t)
	s := w.endpoint("10.0.2.1", 7000)
	r1, r2 := w.endpoint("10.0.2.2", 7001), w.endpoint("10.0.2.2", 7002)
	s1, _ := pair(t, s, r1)  // PHYS_REQ: r1 creates the TGT
	s2, c2 := pair(t, s, r2) // VIRT_REQ: r2 opens it
	nodeA, nodeB := w.f.Node("10.0.2.1"), w.f.Node("10.0.2.2")
	if st := nodeB.Stats(); st.TGTs != 1 || st.TGTHandles != 2 {
		t.Fatalf("node B before: %+v, want one TGT with two handles", st)
	}
	r1.p.Kill()
	// Traffic both ways goes on across the detection and any recovery.
	talkUntil(t, s2, c2, "r2", func() bool { return s.Stats().Conns == 1 })
	if _, err := s1.Recv(ctxT(t, 2*time.Second), make([]byte, 8)); !errors.Is(err, ErrPeerGone) {
		t.Fatalf("connection to the dead process: %v, want ErrPeerGone", err)
	}
	eventually(t, "only r2's state left", func() (bool, string) {
		ss, sb, sa := s.Stats(), nodeB.Stats(), nodeA.Stats()
		return ss.Conns == 1 && ss.Downlinks == 1 && ss.LocalCounts == 1 && ss.Uplinks == 1 &&
				sb.TGTs == 1 && sb.TGTHandles == 1 && sb.INIs == 1 && sa.TGTs == 1 && sa.TGTHandles == 1 && sa.INIs == 1,
			fmt.Sprintf("s %+v, node A %+v, node B %+v", ss, sa, sb)
	})
	roundTrip(t, s2, c2, []byte("still there"))
	t.Logf("sender: %+v", s.Stats())
}

// A process that shares a TGT (not its creator) dies: the creator keeps
// receiving; the TGT lives on with the creator's handle.
func TestEndpointKillSharingReceiver(t *testing.T) {
	w := newWorld(t)
	s := w.endpoint("10.0.3.1", 7000)
	r1, r2 := w.endpoint("10.0.3.2", 7001), w.endpoint("10.0.3.2", 7002)
	s1, c1 := pair(t, s, r1)
	s2, _ := pair(t, s, r2)
	nodeB := w.f.Node("10.0.3.2")
	r2.p.Kill()
	talkUntil(t, s1, c1, "r1", func() bool { return s.Stats().Conns == 1 })
	if err := s2.Send(ctxT(t, 2*time.Second), []byte("x")); !errors.Is(err, ErrPeerGone) {
		t.Fatalf("send to the dead process: %v, want ErrPeerGone", err)
	}
	eventually(t, "only r1's state left", func() (bool, string) {
		ss, sb := s.Stats(), nodeB.Stats()
		return ss.Conns == 1 && ss.Downlinks == 1 && ss.LocalCounts == 1 && sb.TGTs == 1 && sb.TGTHandles == 1 && sb.INIs == 1,
			fmt.Sprintf("s %+v, node B %+v", ss, sb)
	})
	t.Logf("sender: %+v", s.Stats())
}

// moveGate holds back a CONNECT_REQUEST that moves a leg (a PHYS_REQ
// flagged MOVE) until before returns.
type moveGate struct {
	kernel.Kernel
	before func()
}

func (g *moveGate) Event(ctx context.Context, id kernel.ID) (kernel.Event, error) {
	ev, err := g.Kernel.Event(ctx, id)
	var req wire.Req
	if err == nil && ev.Type == kernel.EventConnectRequest && ev.Exchange == kernel.ExchangeXRC &&
		wire.DecodeReq(ev.PrivateData, wire.TypePhysReq, &req) == nil && req.Flags&wire.FlagMove != 0 {
		g.before()
	}
	return ev, err
}

// A sender's recovery moves its legs before it disconnects the old
// physical link: a DREQ first would let the receiver take the sender for
// gone before its MOVE. The gate holds r1's MOVE: meanwhile r1's leg must
// not be marked gone. Then the old link is ended from r1's side (as the
// CM's stale-connection DREQ, or a sender that disconnects first, would
// end it) before the MOVE: the MOVE proves the sender alive, and the leg
// must live on. The first part fails if recover disconnects first, the
// second without legMoved (that race failed CI once, in the VM).
func TestEndpointMoveAfterDREQKeepsLeg(t *testing.T) {
	w := newWorld(t)
	s := w.endpoint("10.0.9.1", 7000, longTimers) // learns of r2's death only by the send below
	r2 := w.endpoint("10.0.9.2", 7002)
	p := w.f.Node("10.0.9.2").Process()
	k, _ := kernel.Unwrap(p)
	var r1e *Endpoint
	gone := func() bool {
		r1e.mu.Lock()
		defer r1e.mu.Unlock()
		for c := range r1e.conns {
			if !c.goneAt.IsZero() {
				return true
			}
		}
		return false
	}
	gated := make(chan struct{})
	gate := &moveGate{Kernel: k, before: func() {
		defer close(gated)
		for end := time.Now().Add(4 * testHeartbeat); time.Now().Before(end); time.Sleep(time.Millisecond) {
			if gone() {
				t.Error("r1's leg was marked gone before its MOVE")
				return
			}
		}
		r1e.mu.Lock()
		var old []kernel.ID
		for id := range r1e.passive {
			old = append(old, id)
		}
		r1e.mu.Unlock()
		if len(old) != 1 {
			t.Errorf("r1 has %d physical links, want 1 (the old one)", len(old))
			return
		}
		k.Disconnect(old[0])
		for deadline := time.Now().Add(5 * time.Second); !gone(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Error("the end of the old link never marked r1's leg")
				return
			}
		}
	}}
	r1e, err := newEndpoint(context.Background(), gate, Config{Process: p, Addr: "10.0.9.2:7001",
		DomainDir: w.dirs["10.0.9.2"], Heartbeat: testHeartbeat, IdleTimeout: testIdle, HandshakeTimeout: testHandshake})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r1e.Close() })
	r1 := &proc{r1e, p}
	s1, c1 := pair(t, s, r1) // r1 creates the TGT
	s2, _ := pair(t, s, r2)  // r2 shares it
	r2.p.Kill()
	// The send reaches r2's SRQ, which is gone: the INI fails, and s
	// recovers with a PHYS_REQ flagged MOVE to r1.
	if err := sendErr(t, s2); !errors.Is(err, ErrPeerGone) {
		t.Fatalf("send to the dead process: %v, want ErrPeerGone", err)
	}
	select {
	case <-gated:
	case <-time.After(10 * time.Second):
		t.Fatalf("no MOVE reached r1: s %+v", s.Stats())
	}
	talkUntil(t, s1, c1, "r1", func() bool { return s.Stats().LegsMoved == 1 && !gone() })
	if st := r1.Stats(); st.Conns != 1 {
		t.Fatalf("r1 after the move: %+v", st)
	}
}

// The sender dies: the TGT's creator learns by the DREQ its INI's death
// sends, the sharers by the idle timeout; each unregisters, the TGT dies
// with its last handle, and the node-wide handle count returns to 0. The
// receivers' own uplinks to the dead node go too.
func TestEndpointKillSender(t *testing.T) {
	w := newWorld(t)
	s := w.endpoint("10.0.4.1", 7000)
	var rs []*proc
	var conns []*Conn
	for i := range 3 {
		r := w.endpoint("10.0.4.2", 7001+i)
		_, c := pair(t, s, r)
		rs, conns = append(rs, r), append(conns, c)
	}
	nodeA, nodeB := w.f.Node("10.0.4.1"), w.f.Node("10.0.4.2")
	if st := nodeB.Stats(); st.TGTs != 1 || st.TGTHandles != 3 {
		t.Fatalf("node B before: %+v", st)
	}
	s.p.Kill()
	for i, c := range conns {
		if _, err := c.Recv(ctxT(t, 5*time.Second), make([]byte, 8)); !errors.Is(err, ErrPeerGone) {
			t.Fatalf("receiver %d: %v, want ErrPeerGone", i, err)
		}
	}
	eventually(t, "both nodes empty", func() (bool, string) {
		sa, sb := nodeA.Stats(), nodeB.Stats()
		return sa.QPs() == 0 && sa.TGTHandles == 0 && sb.QPs() == 0 && sb.TGTHandles == 0,
			fmt.Sprintf("node A %+v, node B %+v", sa, sb)
	})
	for i, r := range rs {
		if st := r.Stats(); st.Conns != 0 || st.QPs != 0 || st.LocalCounts != 0 || st.KernelHandles != 4 {
			t.Errorf("receiver %d: %+v", i, st)
		}
	}
}

// TestEndpointPeerNodePowerOff: the node at the other end goes off the
// fabric without a word (a power cut, not a process kill: no DREQ, no FIN).
// The survivor's calls fail with ErrPeerGone from its own timeouts (sends
// to the node fail, keepalives stop), it lets go of everything toward the
// node (its uplink's INI, its downlink's TGT handle and count, the physical
// link's CM id), and a Dial to the node fails within the handshake timeout,
// leaving nothing: only its domain, its SRQ and its two listeners.
func TestEndpointPeerNodePowerOff(t *testing.T) {
	w := newWorld(t)
	s, r := w.endpoint("10.0.79.1", 7000), w.endpoint("10.0.79.2", 7001)
	sc, rc := pair(t, s, r)
	roundTrip(t, sc, rc, []byte("before"))
	roundTrip(t, rc, sc, []byte("back"))
	base := r.Stats()
	nodeB := w.f.Node("10.0.79.2")
	w.f.Node("10.0.79.1").PowerOff()
	if _, err := rc.Recv(ctxT(t, 10*time.Second), make([]byte, 8)); !errors.Is(err, ErrPeerGone) {
		t.Fatalf("Recv from the node that went off: %v, want ErrPeerGone", err)
	}
	if err := rc.Send(ctxT(t, 10*time.Second), []byte("after")); !errors.Is(err, ErrPeerGone) {
		t.Fatalf("Send to the node that went off: %v, want ErrPeerGone", err)
	}
	eventually(t, "nothing toward the node that went off", func() (bool, string) {
		st, sb := r.Stats(), nodeB.Stats()
		return st.Conns == 0 && st.Uplinks == 0 && st.Downlinks == 0 && st.LocalCounts == 0 && st.QPs == 0 &&
				sb.QPs() == 0 && sb.TGTHandles == 0,
			fmt.Sprintf("r %+v, node B %+v", st, sb)
	})
	// A context without a deadline: HandshakeTimeout bounds the Dial (the
	// guard's cancel would fail the check below).
	ctx, cancel := context.WithCancel(context.Background())
	guard := time.AfterFunc(4*testHandshake, cancel)
	defer guard.Stop()
	c, err := r.Dial(ctx, s.Addr().String())
	if err == nil {
		c.Close()
		t.Fatal("a Dial to the node that went off succeeded")
	}
	if errors.Is(err, context.Canceled) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Dial to the node that went off: %v, want the handshake timeout", err)
	}
	eventually(t, "nothing left of the Dial", func() (bool, string) {
		st, sb := r.Stats(), nodeB.Stats()
		return st.Conns == 0 && st.Uplinks == 0 && st.QPs == 0 && st.KernelHandles == 4 && sb.QPs() == 0,
			fmt.Sprintf("r %+v (before the power-off %+v), node B %+v", st, base, sb)
	})
}

// TestEndpointDeviceFatal: the device under an endpoint fails for good
// (IBV_EVENT_DEVICE_FATAL) while a Recv waits. Nothing completes on such a
// device, so the endpoint learns of it only from the device's event: the
// waiting Recv fails with ErrDeviceRemoved, the endpoint closes itself and
// lets go of every kernel object, and the peer's calls fail with
// ErrPeerGone from its own timeouts, leaving nothing toward the node. An
// endpoint started on the failed device fails at once.
func TestEndpointDeviceFatal(t *testing.T) {
	w := newWorld(t)
	s, r := w.endpoint("10.0.80.1", 7000), w.endpoint("10.0.80.2", 7001)
	sc, rc := pair(t, s, r)
	roundTrip(t, sc, rc, []byte("before"))
	roundTrip(t, rc, sc, []byte("back"))
	recvErr := make(chan error, 1)
	go func() {
		_, err := sc.Recv(ctxT(t, 20*time.Second), make([]byte, 8))
		recvErr <- err
	}()
	nodeA, nodeB := w.f.Node("10.0.80.1"), w.f.Node("10.0.80.2")
	nodeA.FailDevice()
	if err := <-recvErr; !errors.Is(err, ErrDeviceRemoved) {
		t.Fatalf("Recv on the failed device: %v, want ErrDeviceRemoved", err)
	}
	if err := s.Err(); !errors.Is(err, ErrDeviceRemoved) {
		t.Fatalf("endpoint on the failed device: Err() = %v, want ErrDeviceRemoved", err)
	}
	eventually(t, "the endpoint on the failed device released everything", func() (bool, string) {
		sa := nodeA.Stats()
		return s.p.Handles() == 0 && sa.QPs() == 0 && sa.TGTHandles == 0 && sa.XRCDs == 0,
			fmt.Sprintf("handles %d, node A %+v", s.p.Handles(), sa)
	})
	if _, err := rc.Recv(ctxT(t, 10*time.Second), make([]byte, 8)); !errors.Is(err, ErrPeerGone) {
		t.Fatalf("peer's Recv: %v, want ErrPeerGone", err)
	}
	eventually(t, "nothing toward the failed node", func() (bool, string) {
		st, sb := r.Stats(), nodeB.Stats()
		return st.Conns == 0 && st.QPs == 0 && st.LocalCounts == 0 && sb.QPs() == 0 && sb.TGTHandles == 0,
			fmt.Sprintf("r %+v, node B %+v", st, sb)
	})
	p := nodeA.Process()
	defer p.Kill()
	k, _ := kernel.Unwrap(p)
	cfg := Config{Process: p, Addr: "10.0.80.1:7002", DomainDir: w.dirs["10.0.80.1"]}
	if e, err := newEndpoint(context.Background(), k, cfg); err == nil {
		e.Close()
		t.Fatal("an endpoint started on the failed device works")
	} else if !errors.Is(err, syscall.EIO) {
		t.Fatalf("an endpoint started on the failed device: %v, want EIO", err)
	}
}

// A DREQ on an old physical link ends no other sender's legs when QP
// numbers were reused. Receiver r idles out sender sa's connection (sa sends
// no keepalives), so the TGT r made for sa dies while sa, unaware, keeps its
// physical link; the TGT's number goes to r's next TGT, made for sc on
// another node, whose INI has the number sa's has (QP numbers are per
// device). Then sa dies, and its INI's CM id sends the old link a DREQ. The
// DREQ ended the legs "through this TGT from this INI", matched by numbers
// only: it marked sc's live connection gone, and the janitor ended it a
// heartbeat later (ErrPeerGone at sc). Now it ends the legs on the downlink
// that link made, none.
func TestEndpointDREQSparesReusedNumbers(t *testing.T) {
	w := newWorld(t)
	shortIdle := func(c *Config) { c.IdleTimeout = 300 * time.Millisecond }
	// r keeps sa's link with no leg on it (it would end an idle timeout
	// later, lingerLocked) for the DREQ under test.
	lingering := func(c *Config) { c.linkLinger = time.Hour }
	sa := w.endpoint("10.0.63.1", 7000, longTimers)
	r := w.endpoint("10.0.63.2", 7000, shortIdle, lingering)
	sc := w.endpoint("10.0.63.3", 7000, shortIdle)
	upOf := func(p *proc) (ini, tgt uint32) {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.uplinks[0].cur.num, p.uplinks[0].cur.tgt
	}
	links := func() int {
		r.mu.Lock()
		defer r.mu.Unlock()
		return len(r.passive)
	}
	pair(t, sa, r)
	iniA, tgtA := upOf(sa)
	eventually(t, "r idles sa's connection out, and the TGT it made for sa dies", func() (bool, string) {
		st := r.Stats()
		return st.Downlinks == 0 && st.Conns == 0 && st.Uplinks == 0, fmt.Sprintf("%+v", st)
	})
	if n := links(); n != 1 {
		t.Fatalf("setup: r holds %d physical links, want sa's (sa never ended it)", n)
	}
	// The model reuses numbers last in, first out, and r's INI to sa's node
	// went after the TGT: a process on r's node takes the INI's number, so
	// that r's next TGT gets the dead TGT's.
	if _, _, err := w.rawKernel("10.0.63.2").CreateINI(); err != nil {
		t.Fatal(err)
	}
	cs, cr := pair(t, sc, r)
	iniC, tgtC := upOf(sc)
	if iniA != iniC || tgtA != tgtC {
		t.Fatalf("setup: sa's link INI %#x -> TGT %#x, sc's INI %#x -> TGT %#x; want the same numbers", iniA, tgtA, iniC, tgtC)
	}
	if n := links(); n != 2 {
		t.Fatalf("setup: r holds %d physical links, want sa's and sc's", n)
	}
	sa.p.Kill() // its INI's CM id sends the DREQ to r's old link
	eventually(t, "r's watcher of sa's link took its DREQ and ended", func() (bool, string) {
		n := links()
		return n == 1, fmt.Sprint(n, " physical links")
	})
	r.mu.Lock()
	gone := !cr.goneAt.IsZero()
	r.mu.Unlock()
	if gone {
		t.Fatal("the DREQ on sa's old link marked sc's connection's sender gone")
	}
	roundTrip(t, cs, cr, []byte("sc's connection is alive"))
	roundTrip(t, cr, cs, []byte("both ways"))
}

// A receiver dies and a new process on its node gets its SRQ number (the
// kernel reuses it at once). A sender that has not noticed yet still sends
// to that number, through a TGT that lives on: the message lands in the
// stranger's SRQ, and the stranger drops it by its tag.
func TestEndpointSRQNReuseDropsStaleMessages(t *testing.T) {
	w := newWorld(t)
	s := w.endpoint("10.0.5.1", 7000, longTimers)
	r1, r2 := w.endpoint("10.0.5.2", 7001, longTimers), w.endpoint("10.0.5.2", 7002, longTimers)
	s1, _ := pair(t, s, r1)
	s2, c2 := pair(t, s, r2) // keeps the TGT alive
	old := r1.srqn
	r1.p.Kill()
	r3 := w.endpoint("10.0.5.2", 7003, longTimers)
	if r3.srqn != old {
		t.Fatalf("the model did not reuse SRQN %#x (got %#x)", old, r3.srqn)
	}
	s3, c3 := pair(t, s, r3)
	before := r3.Stats().Dropped
	if err := s1.Send(ctxT(t, time.Second), []byte("stale: for the dead r1")); err != nil {
		t.Fatalf("stale send: %v (it should land in r3's SRQ)", err)
	}
	roundTrip(t, s3, c3, []byte("fresh: for r3")) // and not the stale one
	roundTrip(t, s2, c2, []byte("r2 unaffected"))
	if got := r3.Stats().Dropped; got != before+1 {
		t.Fatalf("r3 dropped %d messages, want %d", got, before+1)
	}
}

// A sender whose TGT died (its only receiver died) learns at its next
// dial to that node: the VIRT_REQ naming the dead TGT is rejected
// TGT_GONE, the uplink recovers (nothing to move), and the dial makes a new
// uplink with a PHYS_REQ flagged REPLACES_TGT.
func TestEndpointDialAfterTGTGone(t *testing.T) {
	w := newWorld(t)
	s := w.endpoint("10.0.6.1", 7000, longTimers)
	r1, r2 := w.endpoint("10.0.6.2", 7001, longTimers), w.endpoint("10.0.6.2", 7002, longTimers)
	s1, _ := pair(t, s, r1)
	nodeB := w.f.Node("10.0.6.2")
	r1.p.Kill()
	if st := nodeB.Stats(); st.TGTs != 0 {
		t.Fatalf("the TGT outlived its only holder: %+v", st)
	}
	s2, c2 := pair(t, s, r2)
	roundTrip(t, s2, c2, []byte("over the new uplink"))
	roundTrip(t, c2, s2, []byte("and back"))
	if _, err := s1.Recv(ctxT(t, time.Second), make([]byte, 8)); !errors.Is(err, ErrPeerGone) {
		t.Fatalf("connection to the dead process: %v", err)
	}
	if st := nodeB.Stats(); st.TGTs != 1 || st.TGTHandles != 1 {
		t.Fatalf("node B: %+v", st)
	}
	eventually(t, "one uplink", func() (bool, string) {
		st := s.Stats()
		return st.Uplinks == 1 && st.Conns == 1, fmt.Sprintf("%+v", st)
	})
	if st := s.Stats(); st.Recoveries != 1 || st.LegsMoved != 0 {
		t.Fatalf("sender: %+v, want one recovery that moved nothing", st)
	}
}

// A receiver dies and the sender, not having noticed (timers off), sends to
// its SRQ: the send fails (remote invalid request), which puts the INI in
// the error state and flushes it for every leg on it. The uplink recovers:
// a new INI, a PHYS_REQ flagged REPLACES_TGT|MOVE to the first live
// receiver (a new TGT), a VIRT_REQ flagged MOVE to the others; their
// connections carry on with the same tags, and the old TGT dies with the
// last handle moving off it.
func TestEndpointRecoveryMovesLegs(t *testing.T) {
	w := newWorld(t)
	s := w.endpoint("10.0.7.1", 7000, longTimers)
	r1 := w.endpoint("10.0.7.2", 7001, longTimers)
	r2 := w.endpoint("10.0.7.2", 7002, longTimers)
	r3 := w.endpoint("10.0.7.2", 7003, longTimers)
	s1, _ := pair(t, s, r1)
	s2, c2 := pair(t, s, r2)
	s3, c3 := pair(t, s, r3)
	nodeB := w.f.Node("10.0.7.2")
	s.mu.Lock()
	oldTGT := s.uplinks[0].cur.tgt
	s.mu.Unlock()
	r1.p.Kill()
	if st := nodeB.Stats(); st.TGTs != 1 || st.TGTHandles != 2 {
		t.Fatalf("node B after the kill: %+v", st)
	}
	if err := sendErr(t, s1); !errors.Is(err, ErrPeerGone) {
		t.Fatalf("send to the dead receiver: %v, want ErrPeerGone", err)
	}
	roundTrip(t, s2, c2, []byte("r2 after recovery"))
	roundTrip(t, s3, c3, []byte("r3 after recovery"))
	roundTrip(t, c2, s2, []byte("r2 back"))
	if st := s.Stats(); st.Recoveries != 1 || st.LegsMoved != 2 {
		t.Fatalf("sender: %+v, want one recovery moving two legs", st)
	}
	// The old INI stays until its physical link's TIMEWAIT_EXIT.
	eventually(t, "the old INI destroyed", func() (bool, string) {
		st := s.Stats()
		return st.Uplinks == 1, fmt.Sprintf("%+v", st)
	})
	s.mu.Lock()
	newTGT := s.uplinks[0].cur.tgt
	s.mu.Unlock()
	if newTGT == oldTGT && nodeB.Stats().TGTs == 1 {
		// With LIFO reuse the new TGT may even get the old number; the
		// counts below still tell the old one is gone.
		t.Logf("new TGT reused number %#x", newTGT)
	}
	eventually(t, "old TGT gone, new TGT held by r2 and r3", func() (bool, string) {
		b := nodeB.Stats()
		return b.TGTs == 1 && b.TGTHandles == 2 && r2.Stats().Downlinks == 1 && r3.Stats().Downlinks == 1,
			fmt.Sprintf("node B %+v", b)
	})
}

// ackLoss turns the next send completion into a retry-exceeded error once
// armed, though the message was delivered: an ACK lost until the INI's
// retries ran out, which on a device puts the INI in the error state, so
// every later completion of that INI is flushed.
type ackLoss struct {
	kernel.Kernel
	armed atomic.Bool
	mu    sync.Mutex
	dead  map[kernel.QP]bool
}

func (a *ackLoss) PollSend(ctx context.Context, q kernel.QP, out []kernel.SendCompletion) (int, error) {
	n, err := a.Kernel.PollSend(ctx, q, out)
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := range n {
		switch {
		case a.dead[q]:
			out[i].Status = verbs.WCWRFlushErr
		case a.armed.CompareAndSwap(true, false):
			out[i].Status = verbs.WCRetryExcErr
			if a.dead == nil {
				a.dead = map[kernel.QP]bool{}
			}
			a.dead[q] = true
		}
	}
	return n, err
}

// A message whose send completion is lost is sent again on the rebuilt
// uplink, with those posted after it, and the receiver, which got the
// first copies, drops the second by their sequence numbers: the
// application sees every message once, in order. Both directions of the
// connection carry on.
func TestEndpointRecoveryResendTakenOnce(t *testing.T) {
	w := newWorld(t)
	r := w.endpoint("10.0.7.2", 7000, longTimers)
	lossy := &ackLoss{}
	s := w.wrappedEndpoint("10.0.7.1", 7000, func(k kernel.Kernel) kernel.Kernel { lossy.Kernel = k; return lossy }, longTimers)
	cs, cr := pair(t, s, r)
	ctx := ctxT(t, 10*time.Second)
	if err := sendSeq(ctx, cs, 0, 10); err != nil {
		t.Fatal(err)
	}
	lossy.armed.Store(true)
	if err := sendSeq(ctx, cs, 10, 20); err != nil {
		t.Fatal(err)
	}
	if err := recvSeq(ctx, cr, 0, 20, nil); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if n, err := cr.Recv(short, make([]byte, 64)); err == nil {
		t.Fatalf("a message past the last: %d bytes", n)
	}
	if st := s.Stats(); st.Recoveries != 1 || st.LegsMoved != 1 {
		t.Fatalf("sender: %+v, want one recovery that moved the leg", st)
	}
	// The lost one, and any posted after it before the INI failed (Send
	// does not wait for completions: up to all 20).
	if st := r.Stats(); st.Duplicates < 1 || st.Duplicates > 20 || st.Dropped != 0 {
		t.Fatalf("receiver: %+v, want 1 to 20 duplicates dropped", st)
	}
	roundTrip(t, cr, cs, []byte("back after recovery"))
	roundTrip(t, cs, cr, []byte("forth after recovery"))
}

// postStall holds back the post of the data message numbered seq until
// release is closed: a sender descheduled in the middle of its post, while
// other goroutines send on the same connection.
type postStall struct {
	kernel.Kernel
	seq     uint32
	stalled chan struct{} // closed when the post is held
	release chan struct{}
	once    sync.Once
}

func (s *postStall) PostSend(q kernel.QP, wrs []kernel.SendWR) error {
	for _, wr := range wrs {
		if p := wr.Payload; len(p) >= 5 && p[0] == kindData && binary.BigEndian.Uint32(p[1:]) == s.seq {
			s.once.Do(func() { close(s.stalled) })
			<-s.release
		}
	}
	return s.Kernel.PostSend(q, wrs)
}

// A message is numbered and posted in one turn of its connection: while
// one Send's post is held, the other Sends on the connection wait for
// their turn (a caller whose context ends meanwhile gets its error and
// sends nothing), then go on in order. Every message arrives once, in
// order, none ahead of the held one.
func TestEndpointHeldPostKeepsOrder(t *testing.T) {
	w := newWorld(t)
	r := w.endpoint("10.0.7.2", 7000, longTimers, func(c *Config) { c.RecvWindow = 4 })
	stall := &postStall{stalled: make(chan struct{}), release: make(chan struct{})}
	s := w.wrappedEndpoint("10.0.7.1", 7000, func(k kernel.Kernel) kernel.Kernel { stall.Kernel = k; return stall }, longTimers)
	release := sync.OnceFunc(func() { close(stall.release) })
	t.Cleanup(release) // before the endpoint's Close, even on failure
	cs, cr := pair(t, s, r)
	ctx := ctxT(t, 10*time.Second)
	const total = 300

	first := make(chan error, 1)
	go func() { first <- cs.Send(ctx, seqMsg(0)) }() // numbered 0, then held
	<-stall.stalled
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if err := cs.Send(short, []byte("gave up")); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("send behind a held post: %v, want a deadline error", err)
	}
	rest := make(chan error, 1)
	go func() { rest <- sendSeq(ctx, cs, 1, total) }()
	short, cancel = context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if n, err := cr.Recv(short, make([]byte, 64)); err == nil {
		t.Fatalf("a message (%d bytes) went ahead of the held one", n)
	}
	release()
	if err := recvSeq(ctx, cr, 0, total, nil); err != nil {
		t.Fatal(err)
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := <-rest; err != nil {
		t.Fatal(err)
	}
	short, cancel = context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if n, err := cr.Recv(short, make([]byte, 64)); err == nil {
		t.Fatalf("a message past the last: %d bytes (the abandoned one?)", n)
	}
	if st := r.Stats(); st.Duplicates != 0 || st.Dropped != 0 {
		t.Fatalf("receiver: %+v", st)
	}
}

// flushed is the scene flushMessages sets.
type flushed struct {
	s, r2      *proc
	s1, s2, c2 *Conn  // s1 to the dead receiver
	release    func() // lets the engine hear of completions again
}

// flushMessages sets a sender s with receivers r1 and r2 on one node, sends
// messages 0..9 to r2 (received), then, with s's completions held back,
// kills r1 and sends it one message, on which the INI fails, and messages
// 10..39 to r2, which it flushes: their Sends return all the same.
func flushMessages(t *testing.T, w *world, ctx context.Context) flushed {
	t.Helper()
	r1 := w.endpoint("10.0.7.2", 7001, longTimers)
	r2 := w.endpoint("10.0.7.2", 7002, longTimers)
	gate := &sendGate{}
	s := w.wrappedEndpoint("10.0.7.1", 7000, gate.wrap, longTimers)
	s1, _ := pair(t, s, r1)
	s2, c2 := pair(t, s, r2)
	if err := sendSeq(ctx, s2, 0, 10); err != nil {
		t.Fatal(err)
	}
	if err := recvSeq(ctx, c2, 0, 10, nil); err != nil {
		t.Fatal(err)
	}
	held := make(chan struct{})
	gate.set(held) // the engine hears of no completion for now
	r1.p.Kill()
	// The INI fails on this one (r1's SRQ is gone), and flushes the rest.
	if err := s1.Send(ctx, []byte("to the dead")); err != nil {
		t.Fatalf("send to the dead process (posted, it fails later): %v", err)
	}
	if err := sendSeq(ctx, s2, 10, 40); err != nil {
		t.Fatal(err)
	}
	return flushed{s: s, r2: r2, s1: s1, s2: s2, c2: c2, release: func() { gate.set(nil); close(held) }}
}

// Messages posted after the INI failed, but before its poller told the
// engine, are flushed, never delivered, though their Sends returned: the
// engine keeps them, and the recovery posts them again on the new INI, in
// order, behind what the receiver has. It gets every message once.
func TestEndpointRecoveryResendsFlushed(t *testing.T) {
	w := newWorld(t)
	ctx := ctxT(t, 10*time.Second)
	f := flushMessages(t, w, ctx)
	s, r2, s1, s2, c2 := f.s, f.r2, f.s1, f.s2, f.c2
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if n, err := c2.Recv(short, make([]byte, 64)); err == nil {
		t.Fatalf("a message posted on the failed INI arrived: %d bytes", n)
	}
	f.release()
	if err := recvSeq(ctx, c2, 10, 40, nil); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Recoveries != 1 || st.LegsMoved != 1 {
		t.Fatalf("sender: %+v, want one recovery moving r2's leg", st)
	}
	if st := r2.Stats(); st.Duplicates != 0 || st.Dropped != 0 {
		t.Fatalf("receiver: %+v", st)
	}
	if err := sendErr(t, s1); !errors.Is(err, ErrPeerGone) {
		t.Fatalf("the connection to the dead process: %v, want ErrPeerGone", err)
	}
	roundTrip(t, s2, c2, []byte("after the recovery"))
}

// A receiver is killed while its sender streams to another process of its
// node over the same INI (timers off, so that the sender learns of the
// death only from its own posts): the next send to the dead SRQ fails the
// INI, which flushes the stream's messages in flight; the recovery posts
// them again, so the live receiver gets its whole stream once and in
// order, and the connection to the dead one ends with ErrPeerGone.
func TestEndpointKillReceiverMidStream(t *testing.T) {
	w := newWorld(t)
	s := w.endpoint("10.0.7.1", 7000, longTimers)
	r1 := w.endpoint("10.0.7.2", 7001, longTimers)
	r2 := w.endpoint("10.0.7.2", 7002, longTimers)
	s1, _ := pair(t, s, r1)
	s2, c2 := pair(t, s, r2)
	ctx := ctxT(t, 20*time.Second)
	streamDone := stream(t, ctx, s2, c2, r2)
	r1.p.Kill()
	if err := s1.Send(ctx, []byte("to the dead")); err != nil {
		t.Fatalf("send to the killed receiver (posted, it fails later): %v", err)
	}
	if err := sendErr(t, s1); !errors.Is(err, ErrPeerGone) {
		t.Fatalf("the connection to the killed receiver: %v, want ErrPeerGone", err)
	}
	streamDone()
	if st := s.Stats(); st.Recoveries != 1 || st.LegsMoved != 1 {
		t.Fatalf("sender: %+v, want one recovery moving the live leg", st)
	}
	if st := r2.Stats(); st.Dropped != 0 {
		t.Fatalf("live receiver: %+v", st)
	}
	roundTrip(t, s2, c2, []byte("after the recovery"))
	roundTrip(t, c2, s2, []byte("and back"))
	t.Logf("live receiver dropped %d duplicates", r2.Stats().Duplicates)
}

// stream sends 20,000 numbered messages on c, which d (r's) receives,
// and returns once r has sent credits back a few times; the function it
// returns waits for the stream's end and fails t unless every message
// arrived once and in order.
func stream(t *testing.T, ctx context.Context, c, d *Conn, r *proc) func() {
	t.Helper()
	const total = 20000
	streamed := make(chan error, 1)
	go func() { streamed <- sendSeq(ctx, c, 0, total) }()
	received := make(chan error, 1)
	go func() { received <- recvSeq(ctx, d, 0, total, nil) }()
	eventually(t, "the stream under way", func() (bool, string) {
		st := r.Stats()
		return st.CreditFrames > 10, fmt.Sprintf("%+v", st)
	})
	return func() {
		t.Helper()
		if err := <-streamed; err != nil {
			t.Fatal(err)
		}
		if err := <-received; err != nil {
			t.Fatal(err)
		}
	}
}

// A recovery round whose MOVE of a leg is refused (TGT_GONE) leaves that
// leg for the next round, and must not send its messages in flight again
// on the new INI meanwhile: the receiver takes nothing through the new TGT
// for a leg still on the old one, and a message that completed there would
// be lost. Here r1 dies under a stream to r3 (timers off: the sender learns
// of the death from a send), r2 makes the new TGT, and r3 refuses the
// first MOVE of its leg: r3 still gets the whole stream, once and in order.
func TestEndpointRecoveryResendsMovedLegsOnly(t *testing.T) {
	w := newWorld(t)
	s := w.endpoint("10.0.7.1", 7000, longTimers)
	countedTags(s.Endpoint)
	r1 := w.endpoint("10.0.7.2", 7001, longTimers)
	r2 := w.endpoint("10.0.7.2", 7002, longTimers)
	var k3 *refusingTGT
	r3 := w.wrappedEndpoint("10.0.7.2", 7003, refusingOnce(&k3), longTimers)
	s1, _ := pair(t, s, r1) // the legs are moved in this order (by tag)
	pair(t, s, r2)
	s3, c3 := pair(t, s, r3)
	streamDone := stream(t, ctxT(t, 20*time.Second), s3, c3, r3)
	k3.armed.Store(true)
	r1.p.Kill()
	if err := sendErr(t, s1); !errors.Is(err, ErrPeerGone) {
		t.Fatalf("the connection to the killed receiver: %v, want ErrPeerGone", err)
	}
	streamDone()
	if k3.refused.Load() == 0 {
		t.Fatal("r3 never refused a MOVE: the test did not test")
	}
	if st := s.Stats(); st.Recoveries < 2 {
		t.Fatalf("sender: %+v, want a second recovery round for r3's leg", st)
	}
	roundTrip(t, s3, c3, []byte("after the recovery"))
}

// A leg moved by two recoveries in a row: its second MOVE must be numbered
// past its first (wire.Req.Move), or its receiver refuses it as a late copy
// of the first and the leg fails. Two creators die one after the other; the
// legs of r3 and r4 are moved by VIRT_REQ both times.
func TestEndpointTwoRecoveriesMoveALegTwice(t *testing.T) {
	w := newWorld(t)
	s := w.endpoint("10.0.7.1", 7000, longTimers)
	rs := make([]*proc, 4)
	conns := make([][2]*Conn, 4)
	for i := range rs {
		rs[i] = w.endpoint("10.0.7.2", 7001+i, longTimers)
		conns[i][0], conns[i][1] = pair(t, s, rs[i])
	}
	// The first leg made the uplink (its receiver created the TGT); a
	// recovery's PHYS_REQ goes to the first live leg in tag order, the
	// second one's, so its receiver creates the next TGT.
	for i, want := range []uint64{1, 2} {
		rs[i].p.Kill()
		if err := sendErr(t, conns[i][0]); !errors.Is(err, ErrPeerGone) {
			t.Fatalf("send to dead receiver %d: %v, want ErrPeerGone", i, err)
		}
		for j := i + 1; j < len(rs); j++ {
			roundTrip(t, conns[j][0], conns[j][1], []byte(fmt.Sprintf("to r%d after recovery %d", j, want)))
		}
		if st := s.Stats(); st.Recoveries != want {
			t.Fatalf("sender after killing r%d: %+v, want recovery %d", i, st, want)
		}
	}
	if st := s.Stats(); st.LegsMoved != 3+2 {
		t.Fatalf("sender: %+v, want 3 legs moved by the first recovery and 2 by the second", st)
	}
	for j := 2; j < len(rs); j++ {
		roundTrip(t, conns[j][1], conns[j][0], []byte("back"))
	}
}

// An endpoint opened on a device that has failed already is refused with
// ErrDeviceRemoved, as one open when it failed ends with it: the EIO of the
// failed device's firmware command alone said nothing of why.
func TestEndpointOnFailedDevice(t *testing.T) {
	w := newWorld(t)
	w.f.Node("10.0.81.1").FailDevice()
	p := w.f.Node("10.0.81.1").Process()
	_, err := NewEndpoint(ctxT(t, 5*time.Second), Config{Process: p, Addr: "10.0.81.1:7000", DomainDir: t.TempDir() + "/goxrc"})
	if !errors.Is(err, ErrDeviceRemoved) {
		t.Fatalf("NewEndpoint on a failed device: %v, want ErrDeviceRemoved", err)
	}
	if n := p.Handles(); n != 0 {
		t.Fatalf("the refused endpoint left %d kernel handles", n)
	}
}
