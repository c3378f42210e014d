package xrc

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/xrc/internal/wire"
)

// The causes of Stats.Dropped that no other test reaches, each made to
// happen once on the in-memory fabric: Dropped rises by exactly one,
// nothing is delivered, and nothing is left behind.

// goroutineWith reports whether some goroutine's stack holds every one of
// frames.
func goroutineWith(frames ...string) bool {
	buf := make([]byte, 1<<20)
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		all := true
		for _, f := range frames {
			all = all && strings.Contains(g, f)
		}
		if all {
			return true
		}
	}
	return false
}

// dropStats is an endpoint's counts of what it received and did not
// deliver.
func dropStats(p *proc) string {
	s := p.Stats()
	return fmt.Sprintf("dropped %d, duplicates %d, overruns %d, rejected %d", s.Dropped, s.Duplicates, s.Overruns, s.Rejected)
}

func wantDropped(t *testing.T, p *proc, before Stats, n uint64) {
	t.Helper()
	want := before
	want.Dropped += n
	w := fmt.Sprintf("dropped %d, duplicates %d, overruns %d, rejected %d", want.Dropped, want.Duplicates, want.Overruns, want.Rejected)
	eventually(t, "dropped by one", func() (bool, string) {
		got := dropStats(p)
		return got == w, got + ", want " + w
	})
	time.Sleep(50 * time.Millisecond) // and no more after it
	if got := dropStats(p); got != w {
		t.Fatalf("%s, want %s", got, w)
	}
}

// A data frame too short for its number (a kind byte and 2 bytes where 4
// must follow) is dropped, counted once: the connection is not failed,
// and the next message is the first delivered.
func TestDroppedShortDataFrame(t *testing.T) {
	w := newWorld(t)
	r := w.endpoint("10.0.131.2", 7001)
	a := w.rawPeer("10.0.131.1", 7100)
	ini, acc := physLeg(t, a, r.Addr(), 1, 0)
	c, err := r.Accept(ctxT(t, 2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	before := r.Stats()
	post := func(p string) {
		t.Helper()
		if err := a.k.PostSend(ini, []kernel.SendWR{{WRID: 1, RemoteSRQN: acc.SRQN, Imm: acc.AcceptorTag, Payload: []byte(p)}}); err != nil {
			t.Fatal(err)
		}
	}
	post("D\x00\x00")
	wantDropped(t, r, before, 1)
	post("D\x00\x00\x00\x00first")
	buf := make([]byte, 64)
	if n, err := c.Recv(ctxT(t, time.Second), buf); err != nil || string(buf[:n]) != "first" {
		t.Fatalf("recv: %q %v, want \"first\"", buf[:n], err)
	}
	short, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if n, err := c.Recv(short, buf); err == nil {
		t.Fatalf("delivered %q after the only message", buf[:n])
	}
	if got := r.Stats().Dropped; got != before.Dropped+1 {
		t.Fatalf("dropped %d, want %d", got, before.Dropped+1)
	}
	a.k.Close() // its INI's DREQ ends r's link and the connection
	requireReleased(t, w, r)
}

// A message whose connection ends while the receive loop looks at it (the
// receive loop had found its tag's connection, and let go of the lock to
// ask the acceptor about the TGT): the connection's tag is gone once the
// loop takes the lock again, and the message is dropped, counted once. Here
// the connection's sender fell silent, and the janitor ends it at its idle
// timeout just as the sender's last message comes: the acceptor's view is
// held (as a change of the acceptor's maps holds it) until the receive loop
// waits for it with the message, and the janitor, having taken the tag off,
// waits for it to release the leg. The janitor's look at its links reads
// the view too: it is kept out of the hold (linkLinger: none in the test's
// time), as a real change of the maps is brief.
func TestDroppedConnEndedAsMessageCame(t *testing.T) {
	w := newWorld(t)
	r := w.endpoint("10.0.132.2", 7001, func(c *Config) { c.linkLinger = time.Hour })
	a := w.rawPeer("10.0.132.1", 7100)
	ini, acc := physLeg(t, a, r.Addr(), 1, 0)
	c, err := r.Accept(ctxT(t, 2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	before := r.Stats()
	r.acc.view.Lock()
	held := true
	defer func() {
		if held {
			r.acc.view.Unlock()
		}
	}()
	if err := a.k.PostSend(ini, []kernel.SendWR{{WRID: 1, RemoteSRQN: acc.SRQN, Imm: acc.AcceptorTag, Payload: []byte("D\x00\x00\x00\x00late")}}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the receive loop asks the acceptor about the message's TGT", func() (bool, string) {
		return goroutineWith("(*Endpoint).deliver", "(*acceptor).LegAccepts", "RLock"), ""
	})
	eventually(t, "the janitor ends the silent connection", func() (bool, string) {
		return goroutineWith("(*Endpoint).janitor", "(*Conn).failLocked"), ""
	})
	held = false
	r.acc.view.Unlock()
	wantDropped(t, r, before, 1)
	buf := make([]byte, 64)
	if n, err := c.Recv(ctxT(t, time.Second), buf); err == nil {
		t.Fatalf("delivered %q to a connection that ended", buf[:n])
	} else if !errors.Is(err, ErrPeerGone) {
		t.Fatalf("recv: %v, want the idle timeout's ErrPeerGone", err)
	}
	a.k.Close()
	requireReleased(t, w, r)
}

// A dial announces the tag of its reverse leg (FlagOneExchange); a hostile
// acceptor sends on that tag before it answers, and then answers with an
// ACCEPT that carries no reverse leg (as one that opens it by its own
// request would): the message kept for the leg is dropped, counted once,
// when the dial forgets the tag. The acceptor never opens the leg: the dial
// fails at its deadline, and nothing of it stays.
func TestDroppedEarlyMessageOfLegNeverRegistered(t *testing.T) {
	w := newWorld(t)
	// (An idle timeout past the dial's deadline: h sends a's inbound
	// connection nothing.)
	a := w.endpoint("10.0.133.1", 7000, func(c *Config) { c.IdleTimeout = 5 * time.Second })
	var (
		mu     sync.Mutex
		hook   func(ev kernel.Event)
		hooked = func(ev kernel.Event) {
			mu.Lock()
			h := hook
			mu.Unlock()
			if h != nil {
				h(ev)
			}
		}
	)
	h := w.hookedRawPeer("10.0.133.2", 7100, hooked)
	// h's leg to a: a's inbound connection, whose reverse leg gives a an
	// uplink to h's node in h's domain, so a's dial to h goes by VIRT_REQ.
	ini, acc := physLeg(t, h, a.Addr(), 1, 0)
	ca, err := a.Accept(ctxT(t, 2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "a's uplink to h up", func() (bool, string) {
		a.mu.Lock()
		defer a.mu.Unlock()
		up := len(a.uplinks) == 1 && a.uplinks[0].state == upUp && a.uplinks[0].dom != 0 && ca.sendUp
		return up, fmt.Sprint(len(a.uplinks))
	})
	before := a.Stats()
	announced := make(chan uint32, 1)
	mu.Lock()
	hook = func(ev kernel.Event) {
		var req wire.Req
		if ev.Type != kernel.EventConnectRequest || wire.DecodeReq(ev.PrivateData, wire.TypeVirtReq, &req) != nil ||
			req.Type != wire.TypeVirtReq || req.Flags&wire.FlagOneExchange == 0 {
			return
		}
		if err := h.k.PostSend(ini, []kernel.SendWR{{WRID: 2, RemoteSRQN: acc.SRQN, Imm: req.PeerTag, Payload: []byte("D\x00\x00\x00\x00early")}}); err != nil {
			t.Error(err)
			return
		}
		for end := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
			a.mu.Lock()
			c := a.recv[req.PeerTag]
			kept := c != nil && c.earlyTag == req.PeerTag && len(c.early) == 1
			a.mu.Unlock()
			if kept {
				break
			}
			if time.Now().After(end) {
				t.Error("the message on the announced tag was not kept for it")
				return
			}
		}
		announced <- req.PeerTag
	}
	mu.Unlock()
	_, err = a.Dial(ctxT(t, time.Second), h.addr.String())
	if err == nil {
		t.Fatal("dial up with no reverse leg")
	}
	select {
	case tag := <-announced:
		a.mu.Lock()
		_, still := a.recv[tag]
		a.mu.Unlock()
		if still {
			t.Errorf("tag %#x still registered", tag)
		}
	default:
		t.Fatalf("dial: %v; no VIRT_REQ announcing a reverse leg came", err)
	}
	wantDropped(t, a, before, 1)
	short, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if n, err := ca.Recv(short, make([]byte, 64)); err == nil {
		t.Fatalf("the inbound connection got %d bytes", n)
	}
	if n := a.Stats().Conns; n != 1 {
		t.Fatalf("%d connections, want the inbound one", n)
	}
	h.k.Close()
	requireReleased(t, w, a)
}
