package xrc

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/xrc/internal/wire"
)

// slowSecondPhysMove answers its second PHYS_REQ flagged MOVE after delay:
// a receiver slow to answer (within the MOVE's deadline) in the second
// round of a recovery.
type slowSecondPhysMove struct {
	kernel.Kernel
	n     atomic.Int32
	delay time.Duration
}

func (g *slowSecondPhysMove) Event(ctx context.Context, id kernel.ID) (kernel.Event, error) {
	ev, err := g.Kernel.Event(ctx, id)
	var req wire.Req
	if err == nil && ev.Type == kernel.EventConnectRequest && ev.Exchange == kernel.ExchangeXRC &&
		wire.DecodeReq(ev.PrivateData, wire.TypePhysReq, &req) == nil && req.Flags&wire.FlagMove != 0 {
		n := g.n.Add(1)
		if n == 2 {
			time.Sleep(g.delay)
		}
	}
	return ev, err
}

// A leg whose MOVE a recovery round sees refused TGT_GONE stays on the old
// TGT for the next round. The round still disconnected the old physical
// link, whose DREQ told the old TGT's creator, the leg's receiver, that
// the sender was gone; the receiver ended the leg a heartbeat and a drain
// later, before a next round whose first MOVE took longer (well within its
// deadline) could move it (found by review, 5 runs in 8). The old link now
// stays up until a round leaves no leg behind (uplink.kept).
func TestRecoveryLegLeftForNextRoundKeptAlive(t *testing.T) {
	w := newWorld(t)
	s := w.endpoint("10.0.89.1", 7000)
	s.mu.Lock()
	s.tags.first = []uint32{50, 10, 20} // r3, r2, r1 dialed in this order; moved r2, r1, r3
	s.mu.Unlock()
	var k3 *refusingTGT
	r3 := w.wrappedEndpoint("10.0.89.2", 7003, refusingOnce(&k3))
	g2 := &slowSecondPhysMove{delay: 200 * time.Millisecond} // < the MOVE's deadline, min(5 s, 1 s/2)
	r2 := w.wrappedEndpoint("10.0.89.2", 7002, func(k kernel.Kernel) kernel.Kernel { g2.Kernel = k; return g2 })
	r1 := w.endpoint("10.0.89.2", 7001)
	s3, c3 := pair(t, s, r3) // PHYS: r3 creates the TGT
	pair(t, s, r2)
	s1, _ := pair(t, s, r1)
	if s3.sendTag != 50 {
		t.Fatalf("tags: %d", s3.sendTag)
	}
	// Another sender keeps r3's receive loop busy (its SRQ drains).
	o := w.endpoint("10.0.89.3", 7000)
	so, co := pair(t, o, r3)
	ctx := ctxT(t, 10*time.Second)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			if so.Send(ctx, []byte("o")) != nil {
				return
			}
			time.Sleep(time.Millisecond)
		}
	}()
	go func() {
		buf := make([]byte, 8)
		for {
			if _, err := co.Recv(ctx, buf); err != nil {
				return
			}
		}
	}()

	k3.armed.Store(true)
	r1.p.Kill()
	// The send to r1's dead SRQ starts the recovery.
	if err := sendErr(t, s1); !errors.Is(err, ErrPeerGone) {
		t.Fatalf("send to the killed r1: %v, want ErrPeerGone", err)
	}
	eventually(t, "two recovery rounds", func() (bool, string) {
		st := s.Stats()
		return st.Recoveries >= 2 && g2.n.Load() >= 2, ""
	})
	time.Sleep(500 * time.Millisecond)
	if k3.refused.Load() == 0 {
		t.Fatal("r3 never refused a MOVE")
	}
	buf := make([]byte, 64)
	if err := s3.Send(ctx, []byte("after")); err != nil {
		t.Fatalf("send on the leg left for the next round: %v (s %+v, r3 %+v)", err, s.Stats(), r3.Stats())
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if n, err := c3.Recv(rctx, buf); err != nil || string(buf[:n]) != "after" {
		t.Fatalf("r3's connection: %q %v (s %+v, r3 %+v)", buf[:n], err, s.Stats(), r3.Stats())
	}
}
