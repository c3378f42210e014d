package xrc

import (
	"errors"
	"fmt"
	"testing"
	"time"
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
	s, r, l, armed := srqLiarScene(t, w, "10.0.235")
	armed.Store(true)
	ctx := ctxT(t, 30*time.Second)
	s.mu.Lock()
	s.tags.first = []uint32{1 << 31} // sc's tag sorts after the counted ones
	s.mu.Unlock()
	sc, rc := pair(t, s, r)
	roundTrip(t, sc, rc, []byte("before"))
	awaitSent(t, s, sc)
	countedTags(s.Endpoint) // l's legs sort before sc's (see TestBogusSRQNLiarKeepsHealthyConn)
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
