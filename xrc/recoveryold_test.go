package xrc

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// holdEstablish delays the sender's Establish (the RTU of a PHYS_REQ) by
// hold once armed: a sender slow to take the CONNECT_RESPONSE of its
// recovery's MOVE (the REP's flight, scheduling).
type holdEstablish struct {
	kernel.Kernel
	armed   atomic.Bool
	entered chan struct{}
	hold    time.Duration
}

func (g *holdEstablish) Establish(id kernel.ID) error {
	if g.armed.CompareAndSwap(true, false) {
		close(g.entered)
		time.Sleep(g.hold)
	}
	return g.Kernel.Establish(id)
}

// slowPoll is a receiver that takes a while over each batch it polls (a
// busy process): its SRQ's few receives run out, and senders wait (RNR).
type slowPoll struct {
	kernel.Kernel
	d time.Duration // each poll's pause
}

func (g *slowPoll) PollRecv(ctx context.Context, s kernel.SRQ, out []kernel.RecvCompletion) (int, error) {
	time.Sleep(g.d)
	return g.Kernel.PollRecv(ctx, s, out)
}

// A stream to a busy receiver (RNR) arrives whole, every Send succeeding,
// through a recovery that TGT_GONE from a dial starts while the old TGT
// lives on in another process: recover moves the old INI to ERR before
// its MOVEs, so the sends it held are flushed and go again after the MOVE
// (what the name says is the mechanism; the test checks the stream). It
// guards against the old INI left working: its held sends landed through
// the old TGT after the receiver's SRQ had drained, were dropped, yet
// completed with success, and the stream stalled for want of credits
// (found by review, 5 runs in 5). That stall is for good (keepalives are
// off): the bound is 10 s without a message sent, not the stream's time,
// which the receiver's 1500 polls of 1 ms set (2.2 s in CI; a -race
// package run under a CPU burner had sent 1348 at 13.6 s, a bound of 10 s).
func TestRecoveryOldINISendsNothingAfterMove(t *testing.T) {
	w := newWorld(t)
	w.f.AddNode("10.0.88.2", memfabric.NodeConfig{SRQReceives: 2})
	g := &holdEstablish{entered: make(chan struct{}), hold: 300 * time.Millisecond}
	s := w.wrappedEndpoint("10.0.88.1", 7000, func(k kernel.Kernel) kernel.Kernel { g.Kernel = k; return g }, longTimers)
	countedTags(s.Endpoint)
	r1 := w.wrappedEndpoint("10.0.88.2", 7001, func(k kernel.Kernel) kernel.Kernel { return &slowPoll{k, time.Millisecond} }, longTimers)
	r0 := w.endpoint("10.0.88.2", 7000, longTimers)
	s1, c1 := pair(t, s, r1) // PHYS: r1 creates the TGT, and its leg moves first (tag order)
	pair(t, s, r0)           // VIRT: r0 shares the TGT, which lives on after r1 moves
	// Not the bound: finishMoving's is the stream's progress.
	ctx := ctxT(t, 5*time.Minute)

	// A liar on the receivers' node answers TGT_GONE in our domain.
	liar, _ := tgtGoneLiar(ctx, t, w, s, "10.0.88.2:7100", func(d uint64) uint64 { return d }, 1<<30)
	st := startStream(ctx, s1, c1, 3000)
	st.await(300)
	g.armed.Store(true)
	dctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err := s.Dial(dctx, liar.String()) // TGT_GONE: s rebuilds its uplink to the node
	cancel()
	t.Logf("dial to the liar: %v", err)
	select {
	case <-g.entered:
	case <-time.After(5 * time.Second):
		t.Fatalf("no recovery: s %+v", s.Stats())
	}
	st.finishMoving(t, 10*time.Second, func() string { return fmt.Sprintf("s %+v; r1 %+v", s.Stats(), r1.Stats()) })
	t.Logf("s %+v; r1 %+v", s.Stats(), r1.Stats())
}
