package xrc

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/xrc/internal/wire"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// A process (l) on a healthy receiver's (r's) node, in r's domain, whose
// ACCEPTs name an SRQ number its node does not have: each of our legs to it
// fails its first frame with "remote invalid request", which fails the INI
// it shares with r's connection. l answers MOVEs as an honest process does
// (a dead receiver's are refused, its legs ending there), so a recovery
// moves l's other legs, one of them first with the PHYS_REQ (their tags
// sort first here), and its first frame fails the new INI before r's leg is
// moved: the next round, for each of l's legs. Every such failure counted a
// try against each frame of r's connection posted again on that INI, and
// after maxTries the healthy connection failed ("sends keep failing"). A
// send that fails "remote invalid request" ends its own leg (the receiver's
// SRQ is gone, or never was), so the INI's failure is no try of the frames
// flushed with it.
func TestBogusSRQNLiarKeepsHealthyConn(t *testing.T) {
	w := newWorld(t)
	s, r, l, armed := srqLiarScene(t, w, "10.0.232")
	// A stream from x keeps l's receive loop polling: its SRQ drains, so
	// that l takes every MOVE of its legs (a leg that moved maxPrev times
	// since the last drain waits, BUSY_RETRY).
	x := w.endpoint("10.0.232.3", 7000, longTimers)
	lx, xl := pair(t, l, x)
	armed.Store(true)
	ctx := ctxT(t, 30*time.Second)
	xctx, stopX := context.WithCancel(ctx)
	xdone := make(chan struct{})
	go func() {
		defer close(xdone)
		buf := make([]byte, 64)
		for xctx.Err() == nil {
			if xl.Send(xctx, []byte("x")) != nil {
				return
			}
			if _, err := lx.Recv(xctx, buf); err != nil {
				return
			}
		}
	}()
	defer func() { stopX(); <-xdone }()
	s.mu.Lock()
	s.tags.first = []uint32{1 << 31} // sc's tag sorts after the counted ones
	s.mu.Unlock()
	sc, rc := pair(t, s, r)
	roundTrip(t, sc, rc, []byte("before"))
	awaitSent(t, s, sc)
	// l's legs sort before sc's in a recovery: theirs are counted from 1.
	countedTags(s.Endpoint)
	// r stops taking messages: two fill its SRQ and the third waits (RNR)
	// at the head of the INI, holding back l's first frames, posted next,
	// and sc's messages posted after them.
	r.p.PauseReceives()
	if err := sendSeq(ctx, sc, 0, 3); err != nil {
		t.Fatal(err)
	}
	const liars = maxTries + 4
	for i := range liars {
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		lc, err := s.Dial(dctx, l.Addr().String())
		cancel()
		if err != nil {
			t.Fatalf("dial %d to l: %v (its first frame waits; nothing failed yet)", i, err)
		}
		defer lc.Close()
	}
	if err := sendSeq(ctx, sc, 3, 6); err != nil {
		t.Fatal(err)
	}
	before := s.Stats()
	r.p.ResumeReceives()
	if err := recvSeq(ctx, rc, 0, 6, nil); err != nil {
		t.Fatalf("r: %v (sc err %v; recoveries %d)", err, connErr(sc), s.Stats().Recoveries-before.Recoveries)
	}
	// Precondition: l's legs failed INIs under sc's messages.
	if n := s.Stats().Recoveries - before.Recoveries; n < maxTries {
		t.Fatalf("%d recoveries, want at least %d (one per leg to l)", n, maxTries)
	}
	roundTrip(t, sc, rc, []byte("after"))
	if err := connErr(sc); err != nil {
		t.Fatalf("sc: %v", err)
	}
}

// An application that dials the SRQ liar again and again, each dial's first
// frame failing "remote invalid request": each failed the INI that a
// healthy connection shares, and the uplink recovered once per dial, with
// no bound (48 recoveries for 48 dials). A leg whose first frame fails so
// shows that its acceptor's incarnation gave an SRQ number its node does
// not have (or ended, and then never answers again): later dials to it
// fail at once with ErrProtocol, nothing posted, and the healthy
// connection sees one recovery for all of them.
func TestBogusSRQNLiarRefusedAfterFirstFrame(t *testing.T) {
	w := newWorld(t)
	s, r, l, armed := srqLiarScene(t, w, "10.0.242")
	sc, rc := pair(t, s, r)
	roundTrip(t, sc, rc, []byte("before"))
	armed.Store(true)
	ctx := ctxT(t, 60*time.Second)
	before, handles := s.Stats(), s.p.Handles()
	const dials = 3 * maxTries
	var opened []*Conn
	var refused []error
	var slowest time.Duration
	for i := range dials {
		n := s.Stats().Recoveries
		start := time.Now()
		dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		lc, err := s.Dial(dctx, l.Addr().String())
		cancel()
		if errors.Is(err, ErrProtocol) {
			refused = append(refused, err)
			slowest = max(slowest, time.Since(start))
			continue
		}
		if err == nil {
			opened = append(opened, lc)
		} else if !errors.Is(err, ErrPeerGone) { // its first frame may fail before Dial returns
			t.Fatalf("dial %d to l: %v", i, err)
		}
		// Its first frame fails, and the uplink recovers: wait for it,
		// so that each dial meets the state the last one left.
		eventually(t, fmt.Sprintf("dial %d's first frame failed", i), func() (bool, string) {
			got := s.Stats().Recoveries
			return got > n, fmt.Sprintf("recoveries %d", got-before.Recoveries)
		})
	}
	recoveries := s.Stats().Recoveries - before.Recoveries
	t.Logf("%d dials: %d recoveries, %d refused (the slowest in %v)", dials, recoveries, len(refused), slowest)
	if recoveries > 1 {
		t.Fatalf("%d recoveries of the healthy connection's uplink for %d dials to the liar, want 1", recoveries, dials)
	}
	if len(refused) != dials-1 {
		t.Fatalf("%d of %d dials refused, want all but the first", len(refused), dials)
	}
	if slowest > testHandshake/5 {
		t.Fatalf("a refused dial took %v: not at once", slowest)
	}
	// Refused for the lie (the acceptor ACCEPTed), not for another
	// protocol violation, and not as a gone peer.
	for _, err := range refused {
		if !errors.Is(err, errSRQLiar) || errors.Is(err, ErrPeerGone) {
			t.Fatalf("refused dial: %v, want errSRQLiar alone", err)
		}
	}
	roundTrip(t, sc, rc, []byte("after"))
	if err := connErr(sc); err != nil {
		t.Fatalf("sc: %v", err)
	}
	// A refused dial keeps nothing (a one-exchange ACCEPT's reverse leg
	// had a TGT handle opened): once the first dial's connection is
	// closed, only sc and its uplink are left, and at most one kernel
	// handle more than before: that dial's reverse leg may have come by
	// l's PHYS_REQ, whose TGT lingers an idle timeout after its leg.
	for _, c := range opened {
		c.Close()
	}
	eventually(t, "refused dials released", func() (bool, string) {
		st := s.Stats()
		return st.Conns == before.Conns && st.Uplinks == before.Uplinks && s.p.Handles() <= handles+1,
			fmt.Sprintf("conns %d (%d before), INIs %d (%d), handles %d (%d)", st.Conns, before.Conns, st.Uplinks, before.Uplinks, s.p.Handles(), handles)
	})
}

// srqLiarScene is the SRQ liar's setting on the nodes net.1 and net.2: a
// sender s; an honest receiver r on a node whose SRQs hold two receives; and,
// beside r, l, whose ACCEPTs name an SRQ number the node does not have once
// armed is set.
func srqLiarScene(t *testing.T, w *world, net string) (s, r, l *proc, armed *atomic.Bool) {
	t.Helper()
	armed = new(atomic.Bool)
	w.f.AddNode(net+".2", memfabric.NodeConfig{SRQReceives: 2})
	s = w.endpoint(net+".1", 7000, longTimers)
	r = w.endpoint(net+".2", 7000, longTimers)
	l = w.wrappedEndpoint(net+".2", 7100, func(k kernel.Kernel) kernel.Kernel {
		return tamperAccept{k, armed, func(acc *wire.Accept) { acc.SRQN = 0xFFFFF0 }}
	}, longTimers)
	return s, r, l, armed
}

// The liar's memory is its incarnation, not its address: a process that
// starts on the liar's port after it (a new incarnation, as every start
// draws) is dialed as any other, and its connection works.
func TestBogusSRQNLiarsPortTakenOverIsDialed(t *testing.T) {
	w := newWorld(t)
	s, r, l, armed := srqLiarScene(t, w, "10.0.243")
	sc, rc := pair(t, s, r)
	armed.Store(true)
	dialLiarOnce(t, s, l)
	_, err := s.Dial(ctxT(t, 5*time.Second), l.Addr().String())
	if !errors.Is(err, ErrProtocol) {
		t.Fatalf("second dial to the liar: %v, want ErrProtocol", err)
	}
	l.Close()
	h := w.endpoint(l.Addr().Addr().String(), int(l.Addr().Port()), longTimers)
	sh, hs := pair(t, s, h)
	roundTrip(t, sh, hs, []byte("to the new process"))
	roundTrip(t, hs, sh, []byte("and back"))
	roundTrip(t, sc, rc, []byte("healthy"))
}

// tamperReq is a kernel whose requests for a new leg carry the REQ altered
// by tamper, once armed: a dialer that lies in what it asks.
type tamperReq struct {
	kernel.Kernel
	armed  *atomic.Bool
	tamper func(*wire.Req)
}

func (k tamperReq) Connect(ctx context.Context, dst netip.AddrPort, ex kernel.Exchange, qpNum uint32, pd []byte) (kernel.ID, error) {
	want := wire.TypePhysReq
	if ex == kernel.ExchangeSIDR {
		want = wire.TypeVirtReq
	}
	var req wire.Req
	if k.armed.Load() && wire.DecodeReq(pd, want, &req) == nil && req.Flags&(wire.FlagMove|wire.FlagReciprocal) == 0 {
		k.tamper(&req)
		b := make([]byte, len(pd)+64)
		if n, err := req.Encode(b); err == nil {
			pd = b[:n]
		}
	}
	return k.Kernel.Connect(ctx, dst, ex, qpNum, pd)
}

// The same lie from a dialer: its REQs name an SRQ number its node does not
// have, for the reverse leg, whose first frame then fails the acceptor's
// uplink to that node, shared with a healthy connection. Each dial cost the
// acceptor a recovery; after the first, the acceptor refuses the liar's
// requests for new connections before it makes anything.
func TestBogusSRQNDialerRefusedAfterFirstFrame(t *testing.T) {
	w := newWorld(t)
	var armed atomic.Bool
	w.f.AddNode("10.0.244.1", memfabric.NodeConfig{})
	a := w.endpoint("10.0.244.2", 7000, longTimers)
	h := w.endpoint("10.0.244.1", 7000, longTimers)
	d := w.wrappedEndpoint("10.0.244.1", 7100, func(k kernel.Kernel) kernel.Kernel {
		return tamperReq{k, &armed, func(r *wire.Req) { r.SRQN = 0xFFFFF0 }}
	}, longTimers)
	ah, ha := pair(t, a, h)
	roundTrip(t, ah, ha, []byte("before"))
	pair(t, d, a) // a learns d's node: its reverse legs to d ride the ACCEPT
	armed.Store(true)
	before := a.Stats()
	const dials = 3 * maxTries
	var refused int
	for i := range dials {
		n := a.Stats().Recoveries
		type res struct {
			c   *Conn
			err error
		}
		ch := make(chan res, 1)
		actx, cancel := context.WithTimeout(ctxT(t, 10*time.Second), time.Second)
		go func() {
			c, err := a.Accept(actx)
			ch <- res{c, err}
		}()
		dc, err := d.Dial(ctxT(t, 5*time.Second), a.Addr().String())
		if err != nil {
			cancel()
			<-ch
			var rj *RejectError
			if !errors.As(err, &rj) || rj.Reason != RejectBadRequest {
				t.Fatalf("dial %d from the liar: %v, want REJECT(BAD_REQUEST)", i, err)
			}
			refused++
			continue
		}
		defer dc.Close()
		ac := <-ch
		cancel()
		if ac.err != nil {
			t.Fatalf("accept %d: %v", i, ac.err)
		}
		defer ac.c.Close()
		// a's first frame on the reverse leg names the bogus number.
		if err := ac.c.Send(ctxT(t, 5*time.Second), []byte("x")); err != nil {
			t.Fatalf("send %d: %v", i, err)
		}
		eventually(t, fmt.Sprintf("dial %d's reverse leg failed its first frame", i), func() (bool, string) {
			got := a.Stats().Recoveries
			return got > n, fmt.Sprintf("recoveries %d", got-before.Recoveries)
		})
	}
	recoveries := a.Stats().Recoveries - before.Recoveries
	t.Logf("%d dials: %d recoveries, %d refused", dials, recoveries, refused)
	if recoveries > 1 || refused != dials-1 {
		t.Fatalf("%d recoveries of the acceptor's uplink and %d of %d dials refused, want 1 and all but the first", recoveries, refused, dials)
	}
	roundTrip(t, ah, ha, []byte("after"))
	roundTrip(t, ha, ah, []byte("back"))
}

// The incarnations refused for a bogus SRQ number are the last
// maxSRQLiars, and only a leg none of whose frames arrived is proof: one
// that was reached lost an SRQ that was there, as at an honest death.
func TestSRQLiarsBounded(t *testing.T) {
	defer func(n int) { maxSRQLiars = n }(maxSRQLiars)
	maxSRQLiars = 2
	w := newWorld(t)
	s := w.endpoint("10.0.245.1", 7000)
	peer := netip.MustParseAddrPort("10.0.245.2:7000")
	s.mu.Lock()
	for inc := uint64(1); inc <= 3; inc++ {
		s.srqLiarFirstFrameLocked(&Conn{sendUp: true, raddr: peer, peerInc: inc, peerSRQN: 9})
	}
	s.srqLiarFirstFrameLocked(&Conn{sendUp: true, reached: true, raddr: peer, peerInc: 4, peerSRQN: 9})
	refused := func(inc uint64) bool { return s.srqLiarLocked(peer.Addr(), inc, 9) }
	got := fmt.Sprint(len(s.srqLiars), refused(1), refused(2), refused(3), refused(4))
	// The proof holds for that number at that node only: another node
	// claiming the incarnation, or the incarnation naming another number,
	// is no liar yet.
	other := fmt.Sprint(s.srqLiarLocked(netip.MustParseAddr("10.0.245.3"), 3, 9), s.srqLiarLocked(peer.Addr(), 3, 10))
	s.mu.Unlock()
	if want := fmt.Sprint(2, false, true, true, false); got != want {
		t.Fatalf("entries, refused 1..4: %s, want %s", got, want)
	}
	if other != fmt.Sprint(false, false) {
		t.Fatalf("refused elsewhere, another number: %s, want false false", other)
	}
}

// The same over a physical link: with no other connection to the liar's
// node, each dial to it makes the uplink, and a refused dial's ACCEPT came
// in its PHYS exchange. The refusal lets the new INI and its CM id go.
func TestBogusSRQNLiarRefusedOverPhysLink(t *testing.T) {
	w := newWorld(t)
	s, _, l, armed := srqLiarScene(t, w, "10.0.246")
	armed.Store(true)
	handles := s.p.Handles()
	lc, err := s.Dial(ctxT(t, 5*time.Second), l.Addr().String())
	if err == nil {
		defer lc.Close()
	}
	t.Logf("first dial: %v", err)
	// Its first frame fails: the leg's sending half ends, and with it the
	// uplink, which nothing else holds (no recovery).
	eventually(t, "the uplink gone with the leg's sending half", func() (bool, string) {
		n := s.Stats().Uplinks
		return n == 0, fmt.Sprintf("INIs %d", n)
	})
	for i := range 3 {
		_, err := s.Dial(ctxT(t, 5*time.Second), l.Addr().String())
		if !errors.Is(err, ErrProtocol) {
			t.Fatalf("dial %d after the first: %v, want ErrProtocol", i, err)
		}
		eventually(t, "the refused dial's INI released", func() (bool, string) {
			st := s.Stats()
			return st.Uplinks == 0 && s.p.Handles() == handles,
				fmt.Sprintf("INIs %d, handles %d (%d before)", st.Uplinks, s.p.Handles(), handles)
		})
	}
	if n := s.Stats().Recoveries; n != 0 {
		t.Fatalf("%d recoveries, want none", n)
	}
}

// The mark is the incarnation a peer claims, and it claims any it likes:
// l, a hostile acceptor that has learned an honest process's (h's)
// incarnation (h dialed it once, say), names it in its ACCEPTs beside a
// bogus SRQ number. s's leg to l fails its first frame, and s marks h's
// incarnation, though no frame of s's to h ever failed: s's dials to h
// then failed ErrProtocol and h's dials to s were refused BAD_REQUEST, for
// as long as s lived, wherever h was. A process elsewhere must not be able
// to have an honest peer refused.
func TestBogusSRQNImpersonatedIncarnationSparesHonestPeer(t *testing.T) {
	w := newWorld(t)
	var armed atomic.Bool
	s := w.endpoint("10.0.247.1", 7000, longTimers)
	r := w.endpoint("10.0.247.2", 7000, longTimers)
	h := w.endpoint("10.0.247.3", 7000, longTimers)
	l := w.wrappedEndpoint("10.0.247.2", 7100, func(k kernel.Kernel) kernel.Kernel {
		return tamperAccept{k, &armed, func(acc *wire.Accept) { acc.SRQN, acc.Incarnation = 0xFFFFF0, h.inc }}
	}, longTimers)
	sr, rs := pair(t, s, r) // s's uplink into l's node and domain: its dials to l are VIRT_REQs
	pair(t, l, s)           // l's uplink to s's node: its ACCEPTs carry the reverse leg
	armed.Store(true)
	dialLiarOnce(t, s, l)
	// h never lied, and no frame of s's to h ever failed.
	sh, hs := pair(t, s, h)
	roundTrip(t, sh, hs, []byte("s to honest h"))
	hs2, sh2 := pair(t, h, s)
	roundTrip(t, hs2, sh2, []byte("honest h to s"))
	roundTrip(t, sr, rs, []byte("healthy"))
}

// dialLiarOnce dials l from s once and waits until that leg's first frame
// has failed and s's uplink recovered: from then on s knows l for a liar.
func dialLiarOnce(t *testing.T, s, l *proc) {
	t.Helper()
	before := s.Stats().Recoveries
	if lc, err := s.Dial(ctxT(t, 5*time.Second), l.Addr().String()); err == nil {
		t.Cleanup(func() { lc.Close() })
	}
	eventually(t, "the leg to the liar failed its first frame", func() (bool, string) {
		n := s.Stats().Recoveries - before
		return n > 0, fmt.Sprintf("recoveries %d", n)
	})
}
