package xrc

import (
	"context"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/goxrc/goxrc/internal/kernel"
)

// refusingTGT is a receiver's kernel whose OpenTGT fails, once armed, for
// the TGT numbers refuse picks (every one where refuse is nil): its
// acceptor answers the MOVE or VIRT_REQ that named the TGT with TGT_GONE, as
// one whose TGT's number had just gone would.
type refusingTGT struct {
	kernel.Kernel
	refuse  func(qpn uint32) bool
	armed   atomic.Bool
	refused atomic.Int32
}

func (k *refusingTGT) OpenTGT(d kernel.XRCD, qpn uint32) (kernel.QP, error) {
	if k.armed.Load() && (k.refuse == nil || k.refuse(qpn)) {
		k.refused.Add(1)
		var none kernel.QP
		return none, syscall.EINVAL
	}
	return k.Kernel.OpenTGT(d, qpn)
}

// refusingOnce wraps a receiver's kernel in a refusingTGT that refuses the
// first TGT it is asked to open once armed, and no other; it stores the
// wrapper in *k.
func refusingOnce(k **refusingTGT) func(kernel.Kernel) kernel.Kernel {
	var done atomic.Bool
	return func(inner kernel.Kernel) kernel.Kernel {
		*k = &refusingTGT{Kernel: inner, refuse: func(uint32) bool { return done.CompareAndSwap(false, true) }}
		return *k
	}
}

// goneRounds numbers the TGTs the refusing receivers are asked to open, in
// the order they first are: one a recovery round.
type goneRounds struct {
	mu  sync.Mutex
	idx map[uint32]int
}

func (r *goneRounds) of(qpn uint32) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, ok := r.idx[qpn]
	if !ok {
		n = len(r.idx)
		r.idx[qpn] = n
	}
	return n
}

// failINIThenRefuse is a refusingTGT that, just before its engine reads a
// MOVE of a leg over SIDR, fails the sender's current INI to the node, as
// the TGT side's DREQ does (watchActive).
type failINIThenRefuse struct {
	refusingTGT
	s *Endpoint
}

func (k *failINIThenRefuse) Event(ctx context.Context, id kernel.ID) (kernel.Event, error) {
	ev, err := k.Kernel.Event(ctx, id)
	if err == nil && k.armed.Load() && isMoveRequest(ev) && ev.Exchange == kernel.ExchangeSIDR {
		k.s.mu.Lock()
		for _, u := range k.s.uplinks {
			if u.cur != nil {
				k.s.failINILocked(u, u.cur)
			}
		}
		k.s.mu.Unlock()
	}
	return ev, err
}

// goneScene is the setting of the tests of the TGT_GONE round limit, on the
// nodes net.1 and net.2: a sender s; r1, whose lowest tag has its PHYS_REQ
// make each new INI; the refusing receivers, on ports 7002, 7004, ...; and
// r3, on 7003, whose death forces the recovery (force).
type goneScene struct {
	s        *proc
	conns    []*Conn // s's connections to the refusing receivers
	refusers []*refusingTGT
	r3       *proc
	s3       *Conn
}

// refusal makes a refusing receiver's kernel for a goneScene's sender.
type refusal func(s *Endpoint, inner kernel.Kernel) (kernel.Kernel, *refusingTGT)

// refuseWhere refuses the TGTs refuse picks (nil: every one).
func refuseWhere(refuse func(qpn uint32) bool) refusal {
	return func(_ *Endpoint, inner kernel.Kernel) (kernel.Kernel, *refusingTGT) {
		k := &refusingTGT{Kernel: inner, refuse: refuse}
		return k, k
	}
}

// failINIThenRefuseAll refuses every TGT, failing the sender's INI first.
func failINIThenRefuseAll(s *Endpoint, inner kernel.Kernel) (kernel.Kernel, *refusingTGT) {
	k := &failINIThenRefuse{refusingTGT: refusingTGT{Kernel: inner}, s: s}
	return k, &k.refusingTGT
}

func newGoneScene(t *testing.T, w *world, net string, refusals ...refusal) *goneScene {
	t.Helper()
	g := &goneScene{s: w.endpoint(net+".1", 7000, longTimers)}
	countedTags(g.s.Endpoint)
	r1 := w.endpoint(net+".2", 7001, longTimers)
	var receivers []*proc
	for i, mk := range refusals {
		r := w.wrappedEndpoint(net+".2", 7002+2*i, func(inner kernel.Kernel) kernel.Kernel {
			k, rk := mk(g.s.Endpoint, inner)
			g.refusers = append(g.refusers, rk)
			return k
		}, longTimers)
		receivers = append(receivers, r)
	}
	g.r3 = w.endpoint(net+".2", 7003, longTimers)
	pair(t, g.s, r1)
	for _, r := range receivers {
		c, _ := pair(t, g.s, r)
		g.conns = append(g.conns, c)
	}
	g.s3, _ = pair(t, g.s, g.r3)
	return g
}

// force arms the refusing receivers and kills r3: the sender's failed send
// to it starts the first recovery round.
func (g *goneScene) force(t *testing.T) {
	t.Helper()
	for _, k := range g.refusers {
		k.armed.Store(true)
	}
	g.r3.p.Kill()
	if err := sendErr(t, g.s3); err == nil {
		t.Fatal("a send to the killed r3 succeeded")
	}
}
