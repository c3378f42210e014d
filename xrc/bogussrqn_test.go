package xrc

import (
	"context"
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
