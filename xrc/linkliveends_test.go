package xrc

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// A leg through a physical link fails for a reason that says nothing of its
// sender's death (here the dialer gave up its dial: its FIN came first), and
// no other leg of ours is on the link, while the sender lives and another
// process of our node keeps the TGT. The sender's next leg to us opens the
// TGT again by number, and the sender's death later must end it through
// the link's DREQ (TestEndpointDREQEndsLegOnReopenedDownlink). Ending the
// link at that failure, as for a dead sender, dropped the DREQ: the leg
// waited for its idle timeout.
func TestEndpointLinkOutlivesLegOfLiveSender(t *testing.T) {
	w := newWorld(t)
	rk := &holdReciprocal{held: make(chan struct{}), release: make(chan struct{})}
	s := w.endpoint("10.0.185.1", 7000, longTimers)
	sx := w.endpoint("10.0.185.1", 7001, longTimers)
	r1 := w.wrappedEndpoint("10.0.185.2", 7000, func(k kernel.Kernel) kernel.Kernel { rk.Kernel = k; return rk }, longTimers)
	r2 := w.endpoint("10.0.185.2", 7001, longTimers)
	pair(t, r1, sx) // r1's uplink to s's node: its reciprocal requests go by VIRT_REQ
	rk.armed.Store(true)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dialed := make(chan error, 1)
	go func() {
		_, err := s.dialOnce(ctx, r1.Addr(), true) // PHYS: r1 creates the TGT, its passive link
		dialed <- err
	}()
	awaitSetup(t, rk.held, "r1's reciprocal request never came")
	pair(t, s, r2) // VIRT: r2 opens the TGT by number, and keeps it
	s.mu.Lock()
	tgt := s.uplinks[0].cur.tgt
	s.mu.Unlock()
	halves := inboundHalves(r1)
	if len(halves) != 1 {
		t.Fatalf("setup: %d halves at r1", len(halves))
	}
	cancel() // the dialer lives, and gives its dial up: its FIN ends r1's half
	if err := <-dialed; !errors.Is(err, context.Canceled) {
		t.Fatalf("setup: dial: %v, want its cancel", err)
	}
	eventually(t, "r1's half ended by the dialer's FIN", func() (bool, string) {
		return errors.Is(connErr(halves[0]), errAbandoned), ""
	})
	close(rk.release)
	eventually(t, "r1's handle on the TGT released", func() (bool, string) {
		return r1.acc.LocalCount(tgt) == 0, ""
	})
	requireLinkTakesDREQ(t, s, r1, tgt)
}

// requireLinkTakesDREQ checks that r's physical link from s, whose last leg
// at r failed while s lives and another process of r's node keeps the
// link's TGT, is still there: s's next leg to r opens the TGT again by
// number, and s's death must end it through the link's DREQ.
func requireLinkTakesDREQ(t *testing.T, s, r *proc, tgt uint32) {
	t.Helper()
	_, d := pair(t, s, r) // VIRT: r opens the TGT again by number
	if got := r.acc.LocalCount(tgt); got != 1 {
		t.Fatalf("setup: %v's count on TGT %#x is %d, want 1 (opened again)", r.Addr(), tgt, got)
	}
	s.p.Kill() // its INI's CM id sends the DREQ to r's link
	eventually(t, "the DREQ of the dead sender's link marks the connection from it gone", func() (bool, string) {
		r.mu.Lock()
		defer r.mu.Unlock()
		return !d.goneAt.IsZero(), ""
	})
}

// The same, where the leg failed for its sender's silence: a recovery of
// ours whose MOVE its sender did not answer (errUnanswered). A sender that
// does not answer may live (senderDead), but its link was ended as a dead
// one's: the DREQ at its death was dropped, and its next leg waited for its
// idle timeout.
func TestEndpointLinkOutlivesUnansweredLeg(t *testing.T) {
	w := newWorld(t)
	s := w.endpoint("10.0.186.1", 7000, longTimers)
	sx := w.endpoint("10.0.186.1", 7001, longTimers)
	r1, u, pf := w.unansweredAfterPollFail("10.0.186.2")
	r2 := w.endpoint("10.0.186.2", 7001, longTimers)
	// r1's uplink to s's node reaches sx's TGT: s's death leaves it up,
	// and r1's legs to s tell r1 nothing of it.
	pair(t, r1, sx)
	_, cr := pair(t, s, r1) // PHYS: r1 creates the TGT, its passive link
	pair(t, s, r2)          // VIRT: r2 opens the TGT by number, and keeps it
	s.mu.Lock()
	tgt := s.uplinks[0].cur.tgt
	s.mu.Unlock()
	u.all.Store(true)
	pf.armed.Store(true) // r1's next send poll fails: its recovery's MOVEs go unanswered
	ctx := ctxT(t, 10*time.Second)
	var err error
	for err == nil {
		err = cr.Send(ctx, []byte("to s"))
	}
	if !errors.Is(err, errUnanswered) {
		t.Fatalf("setup: send: %v, want the unanswered MOVE (errUnanswered)", err)
	}
	u.all.Store(false)
	eventually(t, "r1's handle on the TGT released", func() (bool, string) {
		return r1.acc.LocalCount(tgt) == 0, ""
	})
	pair(t, r1, sx) // r1's uplink to s's node again, to sx's TGT
	requireLinkTakesDREQ(t, s, r1, tgt)
}
