package xrc

import (
	"context"
	"fmt"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/goxrc/goxrc/internal/kernel"
)

// failINIThenRefuse is a receiver's kernel that, once armed, answers every
// MOVE of a leg over SIDR TGT_GONE (its OpenTGT fails), and just before its
// engine reads such a MOVE fails the sender's current INI to the node, as
// the TGT side's DREQ does (watchActive).
type failINIThenRefuse struct {
	kernel.Kernel
	s       *Endpoint
	armed   atomic.Bool
	refused atomic.Int32
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

func (k *failINIThenRefuse) OpenTGT(d kernel.XRCD, qpn uint32) (kernel.QP, error) {
	if k.armed.Load() {
		k.refused.Add(1)
		var none kernel.QP
		return none, syscall.EINVAL
	}
	return k.Kernel.OpenTGT(d, qpn)
}

// A receiver that refuses its leg's MOVE TGT_GONE round after round has the
// leg fail after maxGoneRounds rounds, also where each round's new INI has
// failed before the refusal came (its TGT side's DREQ): such a round was not
// counted (only a refusal that found the INI whole was), and the rounds went
// on for as long as the endpoint lived, each one a new INI, physical link and
// TGT, the old ones kept for the leg (uplink.kept).
func TestTGTGoneRoundsCountedWhenINIFailedFirst(t *testing.T) {
	w := newWorld(t)
	s := w.endpoint("10.0.104.1", 7000, longTimers)
	countedTags(s.Endpoint)
	r1 := w.endpoint("10.0.104.2", 7001, longTimers)
	var k2 *failINIThenRefuse
	r2 := w.wrappedEndpoint("10.0.104.2", 7002, func(k kernel.Kernel) kernel.Kernel {
		k2 = &failINIThenRefuse{Kernel: k, s: s.Endpoint}
		return k2
	}, longTimers)
	r3 := w.endpoint("10.0.104.2", 7003, longTimers)
	pair(t, s, r1) // the lowest tag: its PHYS_REQ makes each new INI
	s2, _ := pair(t, s, r2)
	s3, _ := pair(t, s, r3)
	k2.armed.Store(true)
	r3.p.Kill()
	if err := sendErr(t, s3); err == nil {
		t.Fatal("a send to the killed r3 succeeded")
	}
	eventually(t, "r2's leg failed", func() (bool, string) {
		return connErr(s2) != nil, fmt.Sprintf("%+v", s.Stats())
	})
	// maxGoneRounds refusals the leg waits through, then the one that
	// fails it.
	if n := k2.refused.Load(); n > maxGoneRounds+1 {
		t.Fatalf("r2 refused %d MOVEs, want at most %d (sender %+v)", n, maxGoneRounds+1, s.Stats())
	}
}

// Every leg refused TGT_GONE in a round is treated alike: a round counted
// toward maxGoneRounds leaves each of its refused legs for the next one.
// The limit was checked per refusal against the count that round's own
// first refusal had just raised, so in the round that reached
// maxGoneRounds the first answer left its leg for another round and every
// later one failed its leg at once, one round short of the bound: which
// leg failed then was the order the parallel MOVEs were answered in.
func TestTGTGoneRoundLimitSameForEveryLeg(t *testing.T) {
	w := newWorld(t)
	s := w.endpoint("10.0.109.1", 7000, longTimers)
	countedTags(s.Endpoint)
	r1 := w.endpoint("10.0.109.2", 7001, longTimers)
	refusing := func(port int) (*proc, *failINIThenRefuse) {
		var k *failINIThenRefuse
		r := w.wrappedEndpoint("10.0.109.2", port, func(inner kernel.Kernel) kernel.Kernel {
			k = &failINIThenRefuse{Kernel: inner, s: s.Endpoint}
			return k
		}, longTimers)
		return r, k
	}
	r2, k2 := refusing(7002)
	r4, k4 := refusing(7004)
	r3 := w.endpoint("10.0.109.2", 7003, longTimers)
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
	eventually(t, "r2's and r4's legs failed", func() (bool, string) {
		return connErr(s2) != nil && connErr(s4) != nil, fmt.Sprintf("%+v", s.Stats())
	})
	// Each leg waits through maxGoneRounds refusals; the next fails it.
	for name, k := range map[string]*failINIThenRefuse{"r2": k2, "r4": k4} {
		if n := k.refused.Load(); n != maxGoneRounds+1 {
			t.Errorf("%s refused %d MOVEs, want %d (sender %+v)", name, n, maxGoneRounds+1, s.Stats())
		}
	}
}
