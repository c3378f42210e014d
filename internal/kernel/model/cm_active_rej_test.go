package model

import (
	"syscall"
	"testing"

	"github.com/goxrc/goxrc/internal/kernel"
)

// Rule: an active id sends a REJ before the REP as well as after it:
// rdma_reject is ib_send_cm_rej, which REQ_SENT allows (it returns 0), and
// rdma_establish is the kernel's rdma_accept, whose cma_rep_recv rejects
// when the RTU is refused there (EINVAL) — "a failed rdma_accept rejects
// the peer". The listener's unaccepted id goes idle with no event (ucma
// drops them before rdma_accept), so its accept fails; the dialer gets no
// CONNECT_RESPONSE. The model refused both calls and left the exchange
// going.
func TestModelActiveRejectsBeforeREP(t *testing.T) {
	for _, call := range []string{"rdma_reject", "rdma_establish"} {
		t.Run(call, func(t *testing.T) {
			_, a, b := twoNodes(t, ReuseNever)
			pa, pb := a.NewProcess(), b.NewProcess()
			l := listen(t, pb, kernel.ExchangeXRC)
			c := must[kernel.ID](t)(pa.Connect(ctxT(t), addrPort(addrB), kernel.ExchangeXRC, 0x100, nil))
			s := event(t, pb, l, kernel.EventConnectRequest).ID
			if call == "rdma_reject" {
				ok(t, pa.Reject(c, []byte("gave up")))
			} else if err := pa.Establish(c); !isErrno(err, syscall.EINVAL) {
				t.Fatalf("rdma_establish before CONNECT_RESPONSE: %v, want EINVAL", err)
			}
			noEvent(t, pb, s)
			if err := pb.Accept(s, 0x200, nil); !isErrno(err, syscall.EINVAL) {
				t.Fatalf("accept of a request its dialer rejected: %v, want EINVAL", err)
			}
			noEvent(t, pa, c)
			if n := b.StaleEntries(); n != 0 {
				t.Fatalf("%d stale entries left for a rejected request", n)
			}
		})
	}
}
