package xrc

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

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

// refuseEveryOther is a receiver's kernel that, once armed, answers the
// MOVEs of the rounds of its parity TGT_GONE and accepts the others.
type refuseEveryOther struct {
	kernel.Kernel
	rounds  *goneRounds
	parity  int
	armed   atomic.Bool
	refused atomic.Int32
}

func (k *refuseEveryOther) OpenTGT(d kernel.XRCD, qpn uint32) (kernel.QP, error) {
	if k.armed.Load() && k.rounds.of(qpn)%2 == k.parity {
		k.refused.Add(1)
		var none kernel.QP
		return none, syscall.EINVAL
	}
	return k.Kernel.OpenTGT(d, qpn)
}

// Two receivers that take turns refusing their legs' MOVEs TGT_GONE, each
// accepting in the rounds the other refuses, still meet maxGoneRounds: the
// count is the uplink's rounds in a row with a refusal, which a leg's own
// MOVE accepted does not end. Counted per leg and ended so, every round
// would leave one leg behind and start the next, without end, each a new
// INI, physical link and TGT, the old ones kept (uplink.kept).
func TestTGTGoneRoundLimitLegsTakingTurns(t *testing.T) {
	w := newWorld(t)
	s := w.endpoint("10.0.113.1", 7000, longTimers)
	countedTags(s.Endpoint)
	r1 := w.endpoint("10.0.113.2", 7001, longTimers)
	rounds := &goneRounds{idx: map[uint32]int{}}
	refusing := func(port, parity int) (*proc, *refuseEveryOther) {
		var k *refuseEveryOther
		r := w.wrappedEndpoint("10.0.113.2", port, func(inner kernel.Kernel) kernel.Kernel {
			k = &refuseEveryOther{Kernel: inner, rounds: rounds, parity: parity}
			return k
		}, longTimers)
		return r, k
	}
	r2, k2 := refusing(7002, 0)
	r4, k4 := refusing(7004, 1)
	r3 := w.endpoint("10.0.113.2", 7003, longTimers)
	pair(t, s, r1) // the lowest tag: its PHYS_REQ makes each new INI
	s2, _ := pair(t, s, r2)
	s4, _ := pair(t, s, r4)
	s3, _ := pair(t, s, r3)
	k2.armed.Store(true)
	k4.armed.Store(true)
	r3.p.Kill()
	if err := sendErr(t, s3); err == nil {
		t.Fatal("a send to the killed r3 succeeded")
	}
	eventually(t, "a refusing leg failed, the uplink settled", func() (bool, string) {
		s.mu.Lock()
		defer s.mu.Unlock()
		failed := s2.err != nil || s4.err != nil
		for _, u := range s.uplinks {
			if u.state != upUp || len(u.kept) != 0 || len(u.inis) != 1 {
				return false, fmt.Sprintf("%v kept %d inis %d", u.state, len(u.kept), len(u.inis))
			}
		}
		return failed, ""
	})
	if n := k2.refused.Load() + k4.refused.Load(); n != maxGoneRounds+1 {
		t.Errorf("%d MOVEs refused, want %d (sender %+v)", n, maxGoneRounds+1, s.Stats())
	}
	if n := s.Stats().Recoveries; n > maxGoneRounds+1 {
		t.Errorf("%d recoveries, want at most %d", n, maxGoneRounds+1)
	}
	for _, c := range []*Conn{s2, s4} {
		if err := connErr(c); err != nil && !errors.Is(err, ErrPeerGone) {
			t.Errorf("a refusing leg failed with %v, want ErrPeerGone", err)
		}
	}
}

// The limit's failure of a leg gives back what was kept for it: a Send that
// waited on the leg through the rounds returns ErrPeerGone naming the
// refusal, the leg's reference on the uplink goes, and so do the old links
// kept for it, the uplink back to one INI and a fresh count.
func TestTGTGoneRoundLimitGivesBack(t *testing.T) {
	w := newWorld(t)
	s := w.endpoint("10.0.114.1", 7000, longTimers)
	countedTags(s.Endpoint)
	r1 := w.endpoint("10.0.114.2", 7001, longTimers)
	var k2 *failINIThenRefuse
	r2 := w.wrappedEndpoint("10.0.114.2", 7002, func(k kernel.Kernel) kernel.Kernel {
		k2 = &failINIThenRefuse{Kernel: k, s: s.Endpoint}
		return k2
	}, longTimers)
	r3 := w.endpoint("10.0.114.2", 7003, longTimers)
	pair(t, s, r1) // the lowest tag: its PHYS_REQ makes each new INI
	s2, _ := pair(t, s, r2)
	s3, _ := pair(t, s, r3)
	k2.armed.Store(true)
	sent := make(chan error, 1)
	go func() {
		ctx := ctxT(t, 10*time.Second)
		for {
			if err := s2.Send(ctx, []byte("y")); err != nil {
				sent <- err
				return
			}
		}
	}()
	r3.p.Kill()
	if err := sendErr(t, s3); err == nil {
		t.Fatal("a send to the killed r3 succeeded")
	}
	if err := <-sent; !errors.Is(err, ErrPeerGone) || !strings.Contains(err.Error(), "TGT_GONE") {
		t.Fatalf("send on r2's leg: %v, want ErrPeerGone for its refused MOVE", err)
	}
	if n := k2.refused.Load(); n != maxGoneRounds+1 {
		t.Errorf("r2 refused %d MOVEs, want %d", n, maxGoneRounds+1)
	}
	eventually(t, "what was kept for r2's leg given back", func() (bool, string) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if len(s.uplinks) != 1 {
			return false, fmt.Sprintf("%d uplinks", len(s.uplinks))
		}
		u := s.uplinks[0]
		_, leg := u.legs[s2]
		return u.state == upUp && len(u.kept) == 0 && len(u.inis) == 1 && u.refs == 1 && !leg && u.gone == 0,
			fmt.Sprintf("%v kept %d inis %d refs %d r2's leg %v gone %d", u.state, len(u.kept), len(u.inis), u.refs, leg, u.gone)
	})
}
