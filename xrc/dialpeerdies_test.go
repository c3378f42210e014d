package xrc

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// killWhen wraps a process's kernel and, once armed, kills the process as
// the first Accept returns (its REP or SIDR REP is out) or, with onEst, as
// the first ESTABLISHED event is read.
type killWhen struct {
	wrapper
	onEst  bool
	armed  atomic.Bool
	killed atomic.Bool
	kill   func()
}

func (k *killWhen) fire() {
	if k.armed.Load() && k.killed.CompareAndSwap(false, true) {
		k.kill()
	}
}

func (k *killWhen) Accept(id kernel.ID, qpNum uint32, pd []byte) error {
	err := k.Kernel.Accept(id, qpNum, pd)
	if !k.onEst {
		k.fire()
	}
	return err
}

func (k *killWhen) Event(ctx context.Context, id kernel.ID) (kernel.Event, error) {
	ev, err := k.Kernel.Event(ctx, id)
	if k.onEst && err == nil && ev.Type == kernel.EventEstablished {
		k.fire()
	}
	return ev, err
}

// The acceptor dies (kill -9) after it sent the forward leg's ACCEPT, before
// the reverse leg is up: the dialer learns it (a refused RTU or MOVE, a
// keepalive into a receive queue or TGT that is gone) and its Dial ends
// with ErrPeerGone long before the handshake timeout (30 s here); a
// one-exchange dial may instead return a connection that then fails so.
// Nothing of the attempt stays behind.
func TestDialAcceptorDiesBeforeReverseLeg(t *testing.T) {
	long := func(c *Config) {
		c.HandshakeTimeout = 30 * time.Second
		c.Heartbeat, c.IdleTimeout = DefaultHeartbeat, DefaultIdleTimeout
	}
	for _, tc := range []struct {
		name  string
		onEst bool
		// setup makes the victim (wrapped by kw) and any survivors, and
		// returns the connections that must live on (pairs).
		setup func(t *testing.T, w *world, a *proc, wrap func(kernel.Kernel) kernel.Kernel, mod func(*Config)) (victim *proc, live [][2]*Conn, others []*proc)
		// two: dial by two exchanges, as Dial's second attempt does: the
		// one way to a VIRT fallback whose acceptor made the uplink's TGT
		// (that acceptor has an uplink back to us).
		two   bool
		oneEx bool // the reverse leg rides the ACCEPT (else a reciprocal request)
	}{
		{name: "phys/after-accept", setup: fresh},
		{name: "phys/after-established", onEst: true, setup: fresh},
		{name: "virt/fallback/shared-tgt", setup: sharedTGT},
		{name: "virt/fallback/creator", setup: creator, two: true},
		{name: "virt/oneexchange/creator", setup: creator, oneEx: true},
		{name: "virt/oneexchange/shared-tgt", setup: sharedOneEx, oneEx: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			a := w.endpoint("10.0.0.1", 7000, long)
			var kw *killWhen
			wrap := func(k kernel.Kernel) kernel.Kernel {
				kw = &killWhen{wrapper: wrapper{k}, onEst: tc.onEst}
				return kw
			}
			b, live, others := tc.setup(t, w, a, wrap, long)
			kw.kill = b.p.Kill
			one := a.Stats().OneExchange
			kw.armed.Store(true)
			start := time.Now()
			var c *Conn
			var err error
			if tc.two {
				ctx, cancel := context.WithTimeout(context.Background(), a.cfg.HandshakeTimeout)
				c, err = a.dialOnce(ctx, b.Addr(), true)
				cancel()
			} else {
				c, err = a.Dial(context.Background(), b.Addr().String())
			}
			took := time.Since(start)
			t.Logf("dial: %v after %v", err, took)
			// The kill runs in the acceptor's goroutine once its Accept
			// returns, but the ACCEPT is out inside Accept: a one-exchange
			// (SIDR) dial needs nothing more from the acceptor and may be
			// back first.
			eventually(t, "the acceptor killed", func() (bool, string) {
				return kw.killed.Load(), ""
			})
			if got := a.Stats().OneExchange > one; got != tc.oneEx {
				t.Fatalf("reverse leg in the ACCEPT: %v, want %v", got, tc.oneEx)
			}
			if took > 5*time.Second {
				t.Errorf("dial took %v (handshake timeout %v)", took, a.cfg.HandshakeTimeout)
			}
			if err == nil {
				if !tc.oneEx {
					t.Fatalf("dial to a dead acceptor succeeded without its reverse leg's request")
				}
				_, rerr := c.Recv(ctxT(t, 5*time.Second), make([]byte, 8))
				t.Logf("recv: %v after %v", rerr, time.Since(start))
				if !errors.Is(rerr, ErrPeerGone) {
					t.Errorf("recv on a connection to a dead acceptor: %v, want ErrPeerGone", rerr)
				}
				c.Close()
			} else if !errors.Is(err, ErrPeerGone) {
				t.Errorf("dial: %v, want ErrPeerGone", err)
			}
			eventually(t, "only the live connections left", func() (bool, string) {
				s := a.Stats()
				return s.Conns == len(live), fmt.Sprintf("%+v", s)
			})
			for _, l := range live {
				roundTrip(t, l[0], l[1], []byte("still here"))
				roundTrip(t, l[1], l[0], []byte("and here"))
				l[0].Close()
				l[1].Close()
			}
			requireReleased(t, w, append(others, a)...)
			if n := w.f.Node(b.Addr().Addr().String()).Stats(); len(others) == 0 && (n.QPs() != 0 || n.TGTHandles != 0) {
				t.Errorf("the acceptor's node after its death: %+v", n)
			}
			if h := a.p.Handles(); h != 4 {
				t.Errorf("dialer holds %d kernel handles, want 4 (domain, SRQ, two listeners)", h)
			}
		})
	}
}

// fresh: nothing between the dialer and the acceptor: a PHYS forward leg,
// the reverse leg by a reciprocal request.
func fresh(t *testing.T, w *world, a *proc, wrap func(kernel.Kernel) kernel.Kernel, mod func(*Config)) (*proc, [][2]*Conn, []*proc) {
	return w.wrappedEndpoint("10.0.0.2", 7000, wrap, mod), nil, nil
}

// sharedTGT: a is up with b1, whose node the victim shares: a VIRT forward
// leg on b1's TGT; the victim has no uplink to a's node (a reciprocal).
func sharedTGT(t *testing.T, w *world, a *proc, wrap func(kernel.Kernel) kernel.Kernel, mod func(*Config)) (*proc, [][2]*Conn, []*proc) {
	b1 := w.endpoint("10.0.0.2", 7001, mod)
	c1, d1 := pair(t, a, b1)
	return w.wrappedEndpoint("10.0.0.2", 7000, wrap, mod), [][2]*Conn{{c1, d1}}, []*proc{b1}
}

// creator: a is up with the victim, which made the TGT of a's uplink and
// has an uplink to a's node (one exchange, unless asked for two).
func creator(t *testing.T, w *world, a *proc, wrap func(kernel.Kernel) kernel.Kernel, mod func(*Config)) (*proc, [][2]*Conn, []*proc) {
	b := w.wrappedEndpoint("10.0.0.2", 7000, wrap, mod)
	pair(t, a, b) // dies with b
	return b, nil, nil
}

// sharedOneEx: a is up with b1 (b1's TGT), and the victim, on b1's node,
// dialed a (opening b1's TGT for a's reverse leg, and making an uplink to
// a's node): a's dial to the victim is one exchange on b1's TGT.
func sharedOneEx(t *testing.T, w *world, a *proc, wrap func(kernel.Kernel) kernel.Kernel, mod func(*Config)) (*proc, [][2]*Conn, []*proc) {
	b1 := w.endpoint("10.0.0.2", 7001, mod)
	c1, d1 := pair(t, a, b1)
	b := w.wrappedEndpoint("10.0.0.2", 7000, wrap, mod)
	pair(t, b, a) // dies with b
	return b, [][2]*Conn{{c1, d1}}, []*proc{b1}
}
