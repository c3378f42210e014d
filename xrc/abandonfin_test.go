package xrc

import (
	"context"
	"errors"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// holdConnect, once armed, holds the next Connect until release is closed.
type holdConnect struct {
	wrapper
	armed   atomic.Bool
	held    chan struct{}
	release chan struct{}
}

func (k *holdConnect) Connect(ctx context.Context, dst netip.AddrPort, ex kernel.Exchange, qpn uint32, pd []byte) (kernel.ID, error) {
	if k.armed.CompareAndSwap(true, false) {
		close(k.held)
		<-k.release
	}
	return k.Kernel.Connect(ctx, dst, ex, qpn, pd)
}

// A dial given up while the acceptor's request for its reverse leg is on
// its way, on an uplink that carries no other leg: the dialer refuses the
// request, the acceptor's half fails with it and lets the forward leg go,
// the last one on its TGT, and the TGT dies. The dialer's FIN, still to
// go, then found no TGT: retry exceeded, and the whole uplink recovered,
// with no fault anywhere (the chaos explorer's fault-free seeds).
func TestDialAbandonedFINBeforeRefusal(t *testing.T) {
	w := newWorld(t)
	fk := &holdFIN{held: make(chan struct{}), release: make(chan struct{})}
	rk := &holdConnect{held: make(chan struct{}), release: make(chan struct{})}
	a := w.wrappedEndpoint("10.0.58.1", 7000, func(k kernel.Kernel) kernel.Kernel { fk.Kernel = k; return fk })
	b := w.wrappedEndpoint("10.0.58.2", 7000, func(k kernel.Kernel) kernel.Kernel { rk.Kernel = k; return rk })
	rk.armed.Store(true) // b's only Connect: its reverse leg's request
	abandonDialHoldingFIN(t, a, b, fk, rk.held, "the reverse leg's request never came")
	close(rk.release) // the request arrives while the FIN waits
	// Refused, b's half ends at once; a dialer that holds the refusal
	// until its FIN has gone leaves it there.
	finishAbandonedDial(t, a, b, fk)
}

// abandonDialHoldingFIN starts a two-exchange dial from a to b, waits for
// held (what the test holds at b, named by what) and for the dial's
// forward leg to be up, then gives the dial up, and returns once fk holds
// its FIN.
func abandonDialHoldingFIN(t *testing.T, a, b *proc, fk *holdFIN, held <-chan struct{}, what string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dialed := make(chan error, 1)
	go func() {
		_, err := a.dialOnce(ctx, b.Addr(), true)
		dialed <- err
	}()
	awaitSetup(t, held, what)
	eventually(t, "the dial's forward leg up", func() (bool, string) {
		a.mu.Lock()
		defer a.mu.Unlock()
		for _, c := range a.pending {
			if c.sendUp {
				return true, ""
			}
		}
		return false, "not yet"
	})
	fk.armed.Store(true)
	cancel()
	if err := <-dialed; !errors.Is(err, context.Canceled) {
		t.Fatalf("dial: %v, want context.Canceled", err)
	}
	awaitSetup(t, fk.held, "the abandoned dial sent no FIN")
}

// finishAbandonedDial, once what ends b's half is on its way while fk
// holds a's FIN, waits a while for the half to end (well within b's idle
// timeout, which would end it too), then lets the FIN go, and checks that
// a's dial ended with no recovery and b holds no half: a dialer whose
// answer went before its FIN had its uplink recover with no fault.
func finishAbandonedDial(t *testing.T, a, b *proc, fk *holdFIN) {
	t.Helper()
	for deadline := time.Now().Add(testIdle / 4); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		b.mu.Lock()
		n := len(b.conns)
		b.mu.Unlock()
		if n == 0 {
			break
		}
	}
	close(fk.release)
	eventually(t, "a's dial ended", func() (bool, string) {
		a.mu.Lock()
		defer a.mu.Unlock()
		return len(a.conns) == 0 && len(a.pending) == 0, "still there"
	})
	requireNoHalfConn(t, b)
	if s := a.Stats(); s.Recoveries != 0 {
		t.Fatalf("a's uplink recovered with no fault: %+v", s)
	}
}
