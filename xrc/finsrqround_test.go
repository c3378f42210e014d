package xrc

import (
	"context"
	"errors"
	"io"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// holdVirt, once armed, holds the next SIDR Connect (a VIRT_REQ) until
// release is closed.
type holdVirt struct {
	kernel.Kernel
	armed   atomic.Bool
	held    chan struct{}
	release chan struct{}
}

func (k *holdVirt) Connect(ctx context.Context, dst netip.AddrPort, ex kernel.Exchange, qpn uint32, pd []byte) (kernel.ID, error) {
	if ex == kernel.ExchangeSIDR && k.armed.CompareAndSwap(true, false) {
		close(k.held)
		<-k.release
	}
	return k.Kernel.Connect(ctx, dst, ex, qpn, pd)
}

// A leg's full FIN delivered to its receiver's SRQ (a slow receive loop)
// before the sender polled its completion, which a failed send poll lost:
// the recovery that followed moved that leg first, with the PHYS_REQ, so
// the new TGT held only that leg at the receiver, which then took the FIN
// and let the leg go, and the TGT with it. The other leg's VIRT_REQ MOVE,
// naming that TGT, was refused TGT_GONE, and a second round of recovery
// made another TGT: a rebuild of a healthy uplink for nothing. A leg
// whose FIN went to PostSend (finPosted) now makes the new TGT only when
// no other live leg can.
func TestPostedFINInSRQCostsNoSecondRecovery(t *testing.T) {
	w := newWorld(t)
	v := &holdVirt{held: make(chan struct{}), release: make(chan struct{})}
	p := &idlePollFail{waiting: map[kernel.QP]context.CancelFunc{}, fail: map[kernel.QP]bool{}}
	a := w.wrappedEndpoint("10.0.99.23", 7000, func(k kernel.Kernel) kernel.Kernel { v.Kernel = k; p.Kernel = v; return p }, longTimers)
	h := &holdPolls{holding: make(chan struct{}), release: make(chan struct{})}
	b := w.wrappedEndpoint("10.0.99.24", 7000, func(k kernel.Kernel) kernel.Kernel { h.Kernel = k; return h }, longTimers)
	var once, vonce sync.Once
	releaseRecv := func() { once.Do(func() { close(h.release) }) }
	releaseVirt := func() { vonce.Do(func() { close(v.release) }) }
	t.Cleanup(releaseVirt)
	t.Cleanup(releaseRecv)
	a.mu.Lock()
	a.tags.first = []uint32{10, 20} // x, then y: x's leg sorts first
	a.mu.Unlock()
	// b's receive loop holds its next poll: what a sends from now on
	// waits, delivered, in b's SRQ.
	x, dx, y, dy, _ := finInSRQ(t, a, b, h)
	defer dx.Close()
	defer dy.Close()
	defer y.Close()
	v.armed.Store(true) // the recovery's VIRT_REQ MOVE waits
	p.armed.Store(true) // the next poll that takes completions, x's FIN's, fails
	closed := make(chan error, 1)
	go func() { closed <- x.Close() }()
	awaitSetup(t, v.held, "the recovery's VIRT_REQ never came")
	// The PHYS_REQ's leg moved, the new INI made: b now takes x's FIN,
	// which waited in its SRQ, and lets x's leg go.
	releaseRecv()
	if _, err := dx.Recv(ctxT(t, 5*time.Second), make([]byte, 64)); !errors.Is(err, io.EOF) {
		t.Fatalf("dx after x's FIN: %v, want io.EOF", err)
	}
	buf := make([]byte, 64)
	if n, err := dy.Recv(ctxT(t, 5*time.Second), buf); err != nil || string(buf[:n]) != beforeHold {
		t.Fatalf("dy: %q, %v; want %q", buf[:n], err, beforeHold)
	}
	releaseVirt()
	eventually(t, "the recovery done, x's sending leg gone", func() (bool, string) {
		a.mu.Lock()
		defer a.mu.Unlock()
		u := a.uplinks[0]
		return y.err != nil || u.state == upUp && !u.settling && x.sendDone, ""
	})
	if err := connErr(y); err != nil {
		t.Fatalf("y: %v", err)
	}
	if n := a.recoveries.Load(); n != 1 {
		t.Fatalf("%d recoveries after one failed send poll, want 1", n)
	}
	roundTrip(t, y, dy, []byte("forward"))
	roundTrip(t, dy, y, []byte("reverse"))
	if err := awaitClose(t, "x", closed); err != nil {
		t.Fatalf("close: %v", err)
	}
}
