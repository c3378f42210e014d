package xrc

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/xrc/internal/wire"
)

// abortTGTs is failINIs that also notes, as its process sends an ABORT,
// how many TGTs its node holds (tgts), plus one (0: no ABORT yet).
type abortTGTs struct {
	failINIs
	tgts    func() int
	atAbort atomic.Int32
}

func (k *abortTGTs) Connect(ctx context.Context, dst netip.AddrPort, ex kernel.Exchange, qpNum uint32, pd []byte) (kernel.ID, error) {
	var r wire.Req
	if ex == kernel.ExchangeSIDR && wire.DecodeReq(pd, wire.TypeVirtReq, &r) == nil && r.Flags&wire.FlagAbort != 0 {
		k.atAbort.CompareAndSwap(0, int32(k.tgts())+1)
	}
	return k.Kernel.Connect(ctx, dst, ex, qpNum, pd)
}

// An acceptor whose reverse leg fails to open tells the dialer (ABORT)
// while it still holds the dial's forward leg. It let the leg go first:
// the only one on its TGT, the TGT died with it, and the dialer's first
// frame, on its way meanwhile, found no TGT; the dialer's uplink recovered
// and the dial failed on its leg not moved, before the ABORT came (seen as
// a flake of TestDialReverseLegAbortedFailsAtOnce under -race, 1 in 40).
func TestReverseAbortBeforeForwardLegGoes(t *testing.T) {
	w := newWorld(t)
	a := w.endpoint("10.0.103.1", 7000, func(c *Config) { c.HandshakeTimeout = time.Hour })
	k := &abortTGTs{tgts: func() int { return w.f.Node("10.0.103.2").Stats().TGTs }}
	b := w.wrappedEndpoint("10.0.103.2", 7000, func(kk kernel.Kernel) kernel.Kernel { k.Kernel = kk; return k },
		func(c *Config) { c.HandshakeTimeout = 2 * time.Second })
	err := k.dialAborted(t, a, b)
	switch n := k.atAbort.Load(); {
	case n == 0:
		t.Fatalf("no ABORT went (the dial: %v)", err)
	case n == 1:
		t.Fatalf("the acceptor's ABORT went after its forward leg and the TGT with it (the dial: %v)", err)
	}
	if !errors.Is(err, errReverseAborted) {
		t.Fatalf("dial failed with %v; want the acceptor's ABORT", err)
	}
	k.armed.Store(false)
	requireNoHalfConn(t, b)
	requireReleased(t, w, a, b)
}

// abortSeen notes the ids of the ABORTs its process is asked (listener
// events) and, as it refuses one, whether the dial it names (dialFailed)
// has failed already. With hold, the refusal waits until hold is closed (or
// a while): a failed dial returns before it is answered.
type abortSeen struct {
	wrapper
	dialFailed func() bool
	hold       chan struct{}
	mu         sync.Mutex
	ids        map[kernel.ID]bool
	refused    atomic.Int32 // 1: refused with the dial failed, 2: with the dial still up
}

func (k *abortSeen) Event(ctx context.Context, id kernel.ID) (kernel.Event, error) {
	ev, err := k.Kernel.Event(ctx, id)
	var r wire.Req
	if err == nil && ev.Type == kernel.EventConnectRequest && ev.Exchange == kernel.ExchangeSIDR &&
		wire.DecodeReq(ev.PrivateData, wire.TypeVirtReq, &r) == nil && r.Flags&wire.FlagAbort != 0 {
		k.mu.Lock()
		k.ids[ev.ID] = true
		k.mu.Unlock()
	}
	return ev, err
}

func (k *abortSeen) Reject(id kernel.ID, pd []byte) error {
	k.mu.Lock()
	abort := k.ids[id]
	k.mu.Unlock()
	if abort {
		if k.hold != nil {
			select {
			case <-k.hold:
			case <-time.After(2 * time.Second):
			}
		}
		st := int32(2)
		if k.dialFailed() {
			st = 1
		}
		k.refused.CompareAndSwap(0, st)
	}
	return k.Kernel.Reject(id, pd)
}

// A dialer fails the dial an ABORT names before it answers the ABORT: the
// answer lets the acceptor's half fail, and with it the forward leg, the
// only one on its TGT, and a first frame of the dial's posted in between
// found no TGT, recovered the uplink, and failed the dial on its leg not
// moved (the rest of TestDialReverseLegAbortedFailsAtOnce's flake: 1 run
// in 100 under -race with the acceptor's ABORT sent first). The dial, failed
// first, may return before the answer: the test waits for it (it read the
// answer's note at once, a flake of its own: 6 runs in 300 under load).
func TestReverseAbortFailsDialBeforeAnswer(t *testing.T) {
	w := newWorld(t)
	var a *proc
	ak := &abortSeen{ids: map[kernel.ID]bool{}, hold: make(chan struct{})}
	ak.dialFailed = func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		for _, c := range a.pending {
			if !c.inbound && c.err == nil {
				return false
			}
		}
		return true
	}
	a = w.wrappedEndpoint("10.0.104.1", 7000, func(kk kernel.Kernel) kernel.Kernel { ak.Kernel = kk; return ak },
		func(c *Config) { c.HandshakeTimeout = time.Hour })
	k := &failINIs{}
	b := w.wrappedEndpoint("10.0.104.2", 7000, func(kk kernel.Kernel) kernel.Kernel { k.Kernel = kk; return k },
		func(c *Config) { c.HandshakeTimeout = 2 * time.Second })
	err := k.dialAborted(t, a, b)
	// The dial fails before the ABORT is answered, so it may return
	// first: the answer is waited for (the hold makes it come after).
	close(ak.hold)
	for deadline := time.Now().Add(10 * time.Second); ak.refused.Load() == 0 && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	switch ak.refused.Load() {
	case 0:
		t.Fatalf("no ABORT refused (the dial: %v)", err)
	case 2:
		t.Fatalf("the ABORT was answered while its dial was still up (the dial: %v)", err)
	}
	k.armed.Store(false)
	requireNoHalfConn(t, b)
	requireReleased(t, w, a, b)
}
