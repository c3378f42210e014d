package xrc

import (
	"context"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/xrc/internal/wire"
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
type slowPoll struct{ kernel.Kernel }

func (g *slowPoll) PollRecv(ctx context.Context, s kernel.SRQ, out []kernel.RecvCompletion) (int, error) {
	time.Sleep(time.Millisecond)
	return g.Kernel.PollRecv(ctx, s, out)
}

// A recovery started by TGT_GONE from a dial left the old INI working:
// the sends it held for a busy receiver (RNR) were still delivered through
// the old TGT, which another process keeps, and completed with success.
// The receiver moved the leg at the MOVE and takes messages through the
// old TGT only until its SRQ drains; those that landed after were dropped,
// yet the sender took their success for delivery and never sent them
// again: the stream stalled for want of credits (found by review, 5 runs
// in 5). recover now moves the old INI to ERR before its MOVEs.
func TestRecoveryOldINISendsNothingAfterMove(t *testing.T) {
	w := newWorld(t)
	w.f.AddNode("10.0.88.2", memfabric.NodeConfig{SRQReceives: 2})
	g := &holdEstablish{entered: make(chan struct{}), hold: 300 * time.Millisecond}
	s := w.wrappedEndpoint("10.0.88.1", 7000, func(k kernel.Kernel) kernel.Kernel { g.Kernel = k; return g }, longTimers)
	countedTags(s.Endpoint)
	r1 := w.wrappedEndpoint("10.0.88.2", 7001, func(k kernel.Kernel) kernel.Kernel { return &slowPoll{k} }, longTimers)
	r0 := w.endpoint("10.0.88.2", 7000, longTimers)
	s1, c1 := pair(t, s, r1) // PHYS: r1 creates the TGT, and its leg moves first (tag order)
	pair(t, s, r0)           // VIRT: r0 shares the TGT, which lives on after r1 moves
	ctx := ctxT(t, 20*time.Second)

	// A liar on the receivers' node answers TGT_GONE in our domain.
	k := w.rawKernel("10.0.88.2")
	liar := netip.MustParseAddrPort("10.0.88.2:7100")
	l, err := k.Listen(liar, kernel.ExchangeSIDR)
	if err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	domain := s.uplinkForLocked(liar).dom
	s.mu.Unlock()
	go func() {
		for {
			ev, err := k.Event(ctx, l)
			if err != nil {
				return
			}
			var req wire.Req
			if wire.DecodeReq(ev.PrivateData, wire.TypeVirtReq, &req) == nil {
				rj := wire.Reject{Tag: req.ConnTag, Reason: wire.RejectTGTGone, MinVersion: 2, MaxVersion: 2, DomainID: domain}
				b := make([]byte, wire.BudgetSIDRREP)
				n, _ := rj.Encode(b)
				k.Reject(ev.ID, b[:n])
			}
			k.DestroyID(ev.ID)
		}
	}()

	const total = 3000
	var sent atomic.Int64
	var wg sync.WaitGroup
	wg.Add(2)
	sendErr := make(chan error, 1)
	go func() {
		defer wg.Done()
		for i := 0; i < total; i++ {
			if err := s1.Send(ctx, seqMsg(i)); err != nil {
				sendErr <- err
				return
			}
			sent.Store(int64(i + 1))
		}
	}()
	recvErr := make(chan error, 1)
	go func() {
		defer wg.Done()
		recvErr <- recvSeq(ctx, c1, 0, total, nil)
	}()
	for sent.Load() < 300 {
		time.Sleep(time.Millisecond)
	}
	g.armed.Store(true)
	dctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = s.Dial(dctx, liar.String()) // TGT_GONE: s rebuilds its uplink to the node
	cancel()
	t.Logf("dial to the liar: %v", err)
	select {
	case <-g.entered:
	case <-time.After(5 * time.Second):
		t.Fatalf("no recovery: s %+v", s.Stats())
	}
	select {
	case err := <-recvErr:
		if err != nil {
			t.Fatalf("stream: %v (sent %d; s %+v; r1 %+v)", err, sent.Load(), s.Stats(), r1.Stats())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("stream stalled (sent %d; s %+v; r1 %+v)", sent.Load(), s.Stats(), r1.Stats())
	}
	wg.Wait()
	select {
	case err := <-sendErr:
		t.Fatalf("send: %v", err)
	default:
	}
	t.Logf("s %+v; r1 %+v", s.Stats(), r1.Stats())
}
