package xrc

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/xrc/internal/wire"
)

// holdAnswers holds the answer to each VIRT_REQ to dst (a MOVE or not), while
// holds is above 0, after the peer has decided it: it sends on held, then
// waits for release. busy runs as a REJECT(BUSY_RETRY) of a VIRT_REQ or
// PHYS_REQ to dst comes back, before the engine reads it.
type holdAnswers struct {
	kernel.Kernel
	dst     netip.AddrPort
	ids     sync.Map // kernel.ID of each request to dst: whether to hold its answer
	holds   atomic.Int32
	held    chan struct{}
	release chan struct{}
	busy    func()
}

func (k *holdAnswers) Connect(ctx context.Context, dst netip.AddrPort, ex kernel.Exchange, qpn uint32, pd []byte) (kernel.ID, error) {
	id, err := k.Kernel.Connect(ctx, dst, ex, qpn, pd)
	var req wire.Req
	if err == nil && dst == k.dst {
		if ex == kernel.ExchangeSIDR && wire.DecodeReq(pd, wire.TypeVirtReq, &req) == nil {
			k.ids.Store(id, true)
		} else if ex == kernel.ExchangeXRC && wire.DecodeReq(pd, wire.TypePhysReq, &req) == nil {
			k.ids.Store(id, false)
		}
	}
	return id, err
}

func (k *holdAnswers) Event(ctx context.Context, id kernel.ID) (kernel.Event, error) {
	ev, err := k.Kernel.Event(ctx, id)
	hold, ok := k.ids.LoadAndDelete(id)
	if !ok || err != nil {
		return ev, err
	}
	var r wire.Reject
	if (ev.Type == kernel.EventUnreachable || ev.Type == kernel.EventRejected) &&
		wire.DecodeReject(ev.PrivateData, &r) == nil && r.Reason == wire.RejectBusyRetry {
		k.busy()
	}
	if hold.(bool) && k.holds.Add(-1) >= 0 {
		select {
		case k.held <- struct{}{}:
			select {
			case <-k.release:
			case <-ctx.Done():
			}
		case <-ctx.Done():
		}
	}
	return ev, err
}

// A dial whose leg p accepted is rebuilt under it before the ACCEPT is read,
// again and again: each time the dial moves the leg to the uplink's new TGT
// (MOVE). p keeps each TGT the leg left until its SRQ drains (none here, a
// busy receive loop) and refuses the fifth MOVE BUSY_RETRY, which the
// decision table has the sender ask again, as a recovery's MOVE does
// (moveAgain). The dial took it for a final refusal and failed, where the
// same leg bound would have moved once p's SRQ drained: the fifth MOVE a
// VIRT_REQ over the uplink's new TGT, or, the uplink gone (its TGT's maker,
// q, died), the PHYS_REQ that makes the next.
func TestDialMoveBusyRetryAsksAgain(t *testing.T) {
	for _, phys := range []bool{false, true} {
		t.Run(map[bool]string{false: "VIRT", true: "PHYS"}[phys], func(t *testing.T) { dialMoveBusy(t, phys) })
	}
}

func dialMoveBusy(t *testing.T, phys bool) {
	w := newWorld(t)
	const node = "10.0.237.2"
	var drains atomic.Uint64
	g := &holdAnswers{dst: netip.MustParseAddrPort(node + ":7001"), held: make(chan struct{}), release: make(chan struct{}),
		busy: func() { drains.Add(1) }} // p's SRQ drains once it has refused
	s := w.wrappedEndpoint("10.0.237.1", 7000, func(k kernel.Kernel) kernel.Kernel { g.Kernel = k; return g }, longTimers)
	q := w.endpoint(node, 7000, longTimers)
	p := w.endpoint(node, 7001, longTimers)
	p.acc.cfg.Drains = drains.Load // before any request reaches p
	sq, qc := pair(t, s, q)
	s.mu.Lock()
	u := sq.up
	s.mu.Unlock()
	ctx := ctxT(t, 20*time.Second)
	const moves = maxPrev + 1
	g.holds.Store(moves)
	dialed := dialsBehind(ctx, s, p.Addr().String(), 1)
	for i := range moves {
		awaitBeforeDialEnds(t, ctx, g.held, dialed, fmt.Sprintf("round %d: p's answer held", i))
		last := phys && i == moves-1
		if last {
			q.p.Kill() // the recovery finds no receiver: u goes
		}
		// u's TGT side gave up on its link (a DREQ, say): u recovers, q's
		// leg onto a new TGT, while p's ACCEPT waits to be read.
		s.mu.Lock()
		old := u.cur
		s.failINILocked(u, old)
		s.mu.Unlock()
		eventually(t, fmt.Sprintf("round %d: the recovery", i), func() (bool, string) {
			s.mu.Lock()
			defer s.mu.Unlock()
			if last {
				return u.state == upNone, u.state.String()
			}
			return u.cur != old && u.cur != nil && u.state == upUp && !u.settling, u.state.String()
		})
		g.release <- struct{}{}
	}
	res := <-dialed
	if res.err != nil {
		t.Fatalf("dial to p after its leg moved %d times before the dial read an ACCEPT: %v", moves, res.err)
	}
	defer res.c.Close()
	if drains.Load() == 0 {
		t.Fatalf("p refused no MOVE BUSY_RETRY: the test did not fill the leg's TGTs left")
	}
	pc, err := p.Accept(ctx)
	if err != nil {
		t.Fatalf("accept on p: %v", err)
	}
	roundTrip(t, res.c, pc, []byte("p"))
	if !phys {
		roundTrip(t, sq, qc, []byte("q"))
	}
}
