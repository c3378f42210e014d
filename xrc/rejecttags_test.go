package xrc

import (
	"fmt"
	"testing"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/xrc/internal/wire"
)

// A request the endpoint refuses after the acceptor's decision (a reverse
// leg naming no dial of ours, here; an Accept queue full is another) had
// its leg's tag kept from reuse like a released leg's, though no ACCEPT
// ever named it. retiredMax such refusals pushed out of that memory the
// tag of a connection that had just ended, whose messages may still be
// queued: a new leg could be given it (a random draw, forced here) and
// take them.
func TestEndpointRefusedRequestsKeepReleasedTags(t *testing.T) {
	w := newWorld(t)
	s := w.endpoint("10.0.187.1", 7000)
	r := w.endpoint("10.0.187.2", 7000)
	c, d := pair(t, s, r)
	old := d.recvTag
	c.Close()
	d.Close()
	eventually(t, "r's connection released", func() (bool, string) {
		st := r.Stats()
		return st.Conns == 0 && st.LocalCounts == 0, fmt.Sprintf("%+v", st)
	})
	evil := w.rawKernel("10.0.187.3")
	_, iniQPN, err := evil.CreateINI()
	if err != nil {
		t.Fatal(err)
	}
	req := wire.Req{Type: wire.TypePhysReq, Flags: wire.FlagReciprocal, ConnTag: 1, PeerTag: 4242, Incarnation: 0xE71,
		INIQPN: iniQPN, SRQN: 0x30, ReplyPort: 9, Credits: 8, MaxMessage: MaxMessageSize}
	for i := range retiredMax {
		req.ConnTag = uint32(i + 1)
		ev := answer(t, evil, r.Addr(), kernel.ExchangeXRC, iniQPN, encodeReq(t, req))
		var rej wire.Reject
		if ev.Type != kernel.EventRejected || wire.DecodeReject(ev.PrivateData, &rej) != nil || rej.Reason != wire.RejectBadRequest {
			t.Fatalf("request %d: %v %v, want REJECT(BAD_REQUEST)", i, ev.Type, rej.Reason)
		}
	}
	r.acc.tagMu.Lock()
	r.acc.tags.first = []uint32{old} // the acceptor's next draw
	r.acc.tagMu.Unlock()
	_, d2 := pair(t, s, r)
	if d2.recvTag == old {
		t.Fatalf("the new leg got tag %#x, released by the connection just ended", old)
	}
}
