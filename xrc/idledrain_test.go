package xrc

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/xrc/internal/wire"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// An idle receiver (l) takes every MOVE of its legs, however many TGTs
// they left since a message last came. A leg remembers maxPrev TGTs it
// left until the SRQ drains, and the receive loop polled with a deadline
// (so that an idle SRQ counts as drained) only while a handle was kept at
// count 0: where each TGT a leg left kept a leg of its own, l's idle SRQ
// never counted as drained, and from the fifth move on l refused its legs'
// MOVEs BUSY_RETRY. l is TestBogusSRQNLiarKeepsHealthyConn's process whose
// ACCEPTs name no SRQ of its node, without the stream that kept its SRQ
// busy there: each recovery ends the leg whose first frame failed the new
// INI on our side, which l holds on that TGT (nothing tells it), and the
// others move on. Refused BUSY_RETRY eight times each, one after another,
// l's legs held the recovery up for seconds, while r, waiting for its
// messages posted again, heard nothing from us: longer than
// Config.IdleTimeout's default.
func TestIdleReceiverTakesMovesPastMaxPrev(t *testing.T) {
	w := newWorld(t)
	w.f.AddNode("10.0.235.2", memfabric.NodeConfig{SRQReceives: 2})
	s := w.endpoint("10.0.235.1", 7000, longTimers)
	r := w.endpoint("10.0.235.2", 7000, longTimers)
	var armed atomic.Bool
	armed.Store(true)
	l := w.wrappedEndpoint("10.0.235.2", 7100, func(k kernel.Kernel) kernel.Kernel {
		return tamperAccept{k, &armed, func(acc *wire.Accept) { acc.SRQN = 0xFFFFF0 }}
	}, longTimers)
	ctx := ctxT(t, 30*time.Second)
	sc, rc := pair(t, s, r)
	roundTrip(t, sc, rc, []byte("before"))
	awaitSent(t, s, sc)
	countedTags(s.Endpoint) // l's legs sort before sc's (see TestBogusSRQNLiarKeepsHealthyConn)
	s.mu.Lock()
	tag := sc.sendTag
	s.mu.Unlock()
	if tag <= 4096 {
		t.Skipf("sc's random tag %d sorts among the counted ones", tag)
	}
	r.p.PauseReceives()
	if err := sendSeq(ctx, sc, 0, 3); err != nil {
		t.Fatal(err)
	}
	const liars = maxPrev + 4
	var lcs []*Conn
	for i := range liars {
		lc, err := s.Dial(ctx, l.Addr().String())
		if err != nil {
			t.Fatalf("dial %d to l: %v", i, err)
		}
		defer lc.Close()
		lcs = append(lcs, lc)
	}
	r.p.ResumeReceives()
	if err := recvSeq(ctx, rc, 0, 3, nil); err != nil {
		t.Fatalf("r: %v (sc err %v)", err, connErr(sc))
	}
	// Each leg to l ends with its own failed send, its MOVEs taken: none
	// with a MOVE refused.
	for i, lc := range lcs {
		eventually(t, fmt.Sprintf("the end of leg %d to l", i), func() (bool, string) {
			err := connErr(lc)
			return err != nil, fmt.Sprint(err)
		})
		if err := connErr(lc); !errors.Is(err, errSRQGone) {
			t.Errorf("leg %d to l: %v, want its send's failure (%v)", i, err, errSRQGone)
		}
	}
	roundTrip(t, sc, rc, []byte("after"))
}
