package xrc

import (
	"context"
	"errors"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/xrc/internal/wire"
)

// A peer whose legs name an SRQ number its node does not have, in its
// ACCEPTs (we dial it) or in its REQs (it dials us), fails our uplink to its
// node with each leg's first frame: every such failure cost a recovery of
// every leg on the uplink, the honest neighbours' too, with no bound over
// the endpoint's life (24 legs, 24 to 45 recoveries). Past maxUnreached
// failures of unreached SRQ numbers in a period, a leg naming one is refused
// before it posts anything; a neighbour whose SRQ number a leg of ours has
// reached still connects, and the healthy connection loses nothing.
func TestBogusSRQNRecoveriesBounded(t *testing.T) {
	const legs = 3 * maxUnreached
	for _, tc := range []struct {
		name string
		leg  func(t *testing.T, s, l *proc) // one bogus leg, ended
	}{
		{"liar accepts", func(t *testing.T, s, l *proc) {
			go func() {
				if c, err := l.Accept(ctxT(t, 5*time.Second)); err == nil {
					c.Close()
				}
			}()
			c, err := s.Dial(ctxT(t, 5*time.Second), l.Addr().String())
			if err == nil {
				err = c.Send(ctxT(t, 5*time.Second), []byte("x"))
				c.Close()
			}
			if err != nil && !errors.Is(err, ErrPeerGone) {
				t.Fatalf("dial to the liar: %v", err)
			}
		}},
		{"liar dials", func(t *testing.T, s, l *proc) {
			actx, stop := context.WithCancel(ctxT(t, 5*time.Second))
			defer stop()
			accepted := make(chan *Conn, 1)
			go func() {
				c, _ := s.Accept(actx)
				accepted <- c
			}()
			lc, err := l.Dial(ctxT(t, 5*time.Second), s.Addr().String())
			if err == nil {
				defer lc.Close()
				// Accepted, or its reverse leg refused: then our
				// ABORT fails the connection the liar's Dial returned,
				// and Accept never returns it.
				eventuallyWithin(t, 5*time.Second, "accepted or aborted", func() (bool, string) {
					return len(accepted) > 0 || connErr(lc) != nil, "neither"
				})
			} else if !errors.Is(err, ErrPeerGone) && !errors.Is(err, errReverseAborted) {
				t.Fatalf("the liar's dial: %v", err)
			}
			stop()
			c := <-accepted
			if c == nil {
				return
			}
			defer c.Close()
			if err := c.Send(ctxT(t, 5*time.Second), []byte("reply")); err != nil && !errors.Is(err, ErrPeerGone) {
				t.Fatalf("reply to the liar: %v", err)
			}
			eventuallyWithin(t, 5*time.Second, "the reply failed", func() (bool, string) {
				s.mu.Lock()
				defer s.mu.Unlock()
				return c.sendDone, "its sending leg still up"
			})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			s, r, l, armed := srqLiarScene(t, w, "10.0.235")
			if tc.name == "liar dials" {
				// Its REQs name the bogus SRQ number too.
				l = w.wrappedEndpoint("10.0.235.2", 7200, func(k kernel.Kernel) kernel.Kernel {
					return tamperReq{tamperAccept{k, armed, func(acc *wire.Accept) { acc.SRQN = 0xFFFFF0 }}, armed}
				}, longTimers)
			}
			sc, rc := pair(t, s, r)
			roundTrip(t, sc, rc, []byte("before"))
			awaitSent(t, s, sc) // r's SRQ number is reached
			armed.Store(true)
			before := s.Stats().Recoveries
			for range legs {
				tc.leg(t, s, l)
				roundTrip(t, sc, rc, []byte("between"))
				roundTrip(t, rc, sc, []byte("back"))
			}
			if n := s.Stats().Recoveries - before; n > maxUnreached {
				t.Fatalf("%d bogus legs cost %d recoveries of the shared uplink, want at most %d", legs, n, maxUnreached)
			}
			if err := connErr(sc); err != nil {
				t.Fatalf("sc: %v", err)
			}
			// r, whose SRQ number sc reached, still connects, both ways.
			c1, d1 := pair(t, s, r)
			roundTrip(t, c1, d1, []byte("new to r"))
			d2, c2 := pair(t, r, s)
			roundTrip(t, c2, d2, []byte("new from r"))
		})
	}
}

// Receivers that die after our frames reached them fail their sends
// "remote invalid request" as a liar's do, but spend nothing of the bound:
// after more such deaths than maxUnreached, a process that got a dead one's
// SRQ number (the stale case tags cover) is dialed and answers.
func TestBogusSRQNBoundSparesReachedDeaths(t *testing.T) {
	w := newWorld(t)
	s := w.endpoint("10.0.236.1", 7000, longTimers)
	r := w.endpoint("10.0.236.2", 7000, longTimers)
	sc, rc := pair(t, s, r) // keeps the uplink and its TGT
	roundTrip(t, sc, rc, []byte("before"))
	var old uint32
	for i := range maxUnreached + 2 {
		d := w.endpoint("10.0.236.2", 7100+i, longTimers)
		dc, cd := pair(t, s, d)
		roundTrip(t, dc, cd, []byte("reached"))
		awaitSent(t, s, dc)
		old = d.srqn
		d.p.Kill()
		// Its SRQ is gone: our next send fails, and the uplink recovers.
		if err := dc.Send(ctxT(t, 5*time.Second), []byte("to the dead")); err == nil {
			eventuallyWithin(t, 5*time.Second, "the send to the dead SRQ failed", func() (bool, string) {
				return connErr(dc) != nil, "dc still up"
			})
		}
		roundTrip(t, sc, rc, []byte("between"))
	}
	n := w.endpoint("10.0.236.2", 7300, longTimers)
	if n.srqn != old {
		t.Fatalf("the model did not reuse SRQN %#x (got %#x)", old, n.srqn)
	}
	c, d := pair(t, s, n)
	roundTrip(t, c, d, []byte("to the new process"))
	roundTrip(t, d, c, []byte("and back"))
}

// tamperReq is a kernel whose requests, once armed, name an SRQ number its
// node does not have: the dialer of a peer that lies in its REQs.
type tamperReq struct {
	kernel.Kernel
	armed *atomic.Bool
}

func (k tamperReq) Connect(ctx context.Context, dst netip.AddrPort, ex kernel.Exchange, qpNum uint32, pd []byte) (kernel.ID, error) {
	t := wire.TypeVirtReq
	if ex == kernel.ExchangeXRC {
		t = wire.TypePhysReq
	}
	var r wire.Req
	if k.armed.Load() && wire.DecodeReq(pd, t, &r) == nil {
		r.SRQN = 0xFFFFF0
		b := make([]byte, len(pd))
		if n, err := r.Encode(b); err == nil {
			pd = b[:n]
		}
	}
	return k.Kernel.Connect(ctx, dst, ex, qpNum, pd)
}
