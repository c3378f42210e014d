package xrc

import (
	"context"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// recoverAtDialUp, once armed, holds the next XRC Connect (a recovery's
// PHYS_REQ) until release is closed, and calls onKeepalive once after it
// posts the next keepalive.
type recoverAtDialUp struct {
	wrapper
	hold        atomic.Bool
	release     chan struct{}
	watch       atomic.Bool
	onKeepalive func()
}

func (k *recoverAtDialUp) Connect(ctx context.Context, dst netip.AddrPort, ex kernel.Exchange, qpn uint32, pd []byte) (kernel.ID, error) {
	if ex == kernel.ExchangeXRC && k.hold.CompareAndSwap(true, false) {
		<-k.release
	}
	return k.Kernel.Connect(ctx, dst, ex, qpn, pd)
}

func (k *recoverAtDialUp) PostSend(q kernel.QP, wrs []kernel.SendWR) error {
	err := k.Kernel.PostSend(q, wrs)
	if err == nil && len(wrs) == 1 && len(wrs[0].Payload) == 1 && wrs[0].Payload[0] == kindHeartbeat && k.watch.CompareAndSwap(true, false) {
		k.onKeepalive()
	}
	return err
}

// A first-contact dial (its reverse leg by the acceptor's reciprocal
// request) is up both ways just as its uplink recovers: Dial waits for the
// recovery to post its first frame. The recovery's resend posts a keepalive
// first (firstDue), which completes the acceptor's half; the dial's context
// ends right after. Dial must not then give up with a FIN that follows that
// keepalive: Accept returned a connection whose Dial had failed (reading
// io.EOF), 5 runs in 5.
func TestDialUpKeepaliveByRecoveryCommitsTheDial(t *testing.T) {
	w := newWorld(t)
	g := &recoverAtDialUp{release: make(chan struct{})}
	a := w.wrappedEndpoint("10.0.99.1", 7000, func(k kernel.Kernel) kernel.Kernel { g.Kernel = k; return g })
	b := w.endpoint("10.0.99.2", 7000)
	released := false
	t.Cleanup(func() {
		if !released {
			close(g.release)
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	g.onKeepalive = cancel // the dial's context ends as the recovery's keepalive goes
	var dial atomic.Pointer[Conn]
	var failed atomic.Bool
	hook := func(d decision) {
		if !d.Accept || d.Leg == nil || d.Leg.Reciprocal == 0 {
			return
		}
		// The dial's first probe is out: then its uplink fails, and its
		// recovery waits.
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			a.mu.Lock()
			c := a.pending[d.Leg.Reciprocal]
			if c != nil && c.firstHeld && c.sendUp && !c.lastSent.IsZero() {
				dial.Store(c)
				g.hold.Store(true)
				a.failINILocked(c.up, c.up.cur)
				a.mu.Unlock()
				failed.Store(true)
				return
			}
			a.mu.Unlock()
			time.Sleep(time.Millisecond)
		}
	}
	a.testAfterDecide.Store(&hook)
	type res struct {
		c   *Conn
		err error
	}
	dialed := make(chan res, 1)
	go func() {
		c, err := a.dialOnce(ctx, b.Addr(), true)
		dialed <- res{c, err}
	}()
	eventually(t, "the dial up, its first frame due, its uplink recovering", func() (bool, string) {
		c := dial.Load()
		if c == nil || !failed.Load() {
			return false, "no reciprocal request yet"
		}
		a.mu.Lock()
		defer a.mu.Unlock()
		return c.isReady && !c.firstHeld && c.firstDue, "not yet"
	})
	g.watch.Store(true)
	released = true
	close(g.release)
	r := <-dialed
	if r.err != nil {
		// Given up: its half at b must not reach Accept.
		requireNoHalfConn(t, b)
		return
	}
	d, err := b.Accept(ctxT(t, 5*time.Second))
	if err != nil {
		t.Fatalf("the dial returned a connection, Accept none: %v", err)
	}
	roundTrip(t, r.c, d, []byte("forward"))
	roundTrip(t, d, r.c, []byte("reverse"))
	r.c.Close()
	d.Close()
	requireReleased(t, w, a, b)
}
