package xrc

import (
	"context"
	"errors"
	"net/netip"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/verbs"
)

// sidrConnectFails fails the engine's SIDR Connects while fail is set, as
// kcm's does when the address or route does not resolve: no SIDR REQ goes.
type sidrConnectFails struct {
	wrapper
	fail  atomic.Bool
	tried atomic.Int64
}

func (k *sidrConnectFails) Connect(ctx context.Context, dst netip.AddrPort, ex kernel.Exchange, qpNum uint32, pd []byte) (kernel.ID, error) {
	if ex == kernel.ExchangeSIDR && k.fail.Load() {
		k.tried.Add(1)
		return 0, &verbs.OpError{Op: "rdma_resolve_route", Err: syscall.EHOSTUNREACH}
	}
	return k.Kernel.Connect(ctx, dst, ex, qpNum, pd)
}

// Stats.VirtReqs counts "VIRT_REQs sent". It was counted before the SIDR
// Connect, so a request that never went out (the Connect failed, or the
// dial's context had ended) counted as sent.
func TestStatsVirtReqsCountsOnlyRequestsSent(t *testing.T) {
	w := newWorld(t)
	k := &sidrConnectFails{}
	a := w.wrappedEndpoint("10.0.68.1", 7000, func(in kernel.Kernel) kernel.Kernel { k.Kernel = in; return k })
	b := w.endpoint("10.0.68.2", 7000)
	c, s := pair(t, a, b) // the uplink: a PHYS_REQ
	roundTrip(t, c, s, []byte("up"))
	before := a.Stats().VirtReqs

	k.fail.Store(true)
	_, err := a.Dial(ctxT(t, 5*time.Second), b.Addr().String())
	if !errors.Is(err, syscall.EHOSTUNREACH) || k.tried.Load() != 1 {
		t.Fatalf("dial over a failing SIDR Connect: %v (%d Connects), want its error", err, k.tried.Load())
	}
	if n := a.Stats().VirtReqs - before; n != 0 {
		t.Errorf("%d VIRT_REQs counted for a SIDR Connect that failed, want 0", n)
	}

	k.fail.Store(false)
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := a.Dial(ended, b.Addr().String()); !errors.Is(err, context.Canceled) {
		t.Fatalf("dial with an ended context: %v, want context.Canceled", err)
	}
	if n := a.Stats().VirtReqs - before; n != 0 {
		t.Errorf("%d VIRT_REQs counted for a dial whose context had ended, want 0", n)
	}

	c2, s2 := pair(t, a, b)
	roundTrip(t, c2, s2, []byte("over the uplink"))
	if n := a.Stats().VirtReqs - before; n != 1 {
		t.Errorf("%d VIRT_REQs counted for one dial over the uplink, want 1", n)
	}
}
