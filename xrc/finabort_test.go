package xrc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/xrc/internal/wire"
)

// finThenAbort is the kernel of an acceptor whose failed half's FIN
// (finAcceptedLocked) goes and whose completion a failed send poll loses,
// so that its ABORT goes too: its reciprocal request waits in Connect
// while holding, the send poll that takes the completion of the first FIN
// posted once pollArmed fails, and its ABORT waits in Connect until
// abortGo is closed. Not the next poll that takes any completion: under
// load that could be a poll of other frames of b's, before the FIN was
// posted; the recovery it started was over before the FIN, which went on
// the new INI and completed, and no ABORT went ("setup: no ABORT went"),
// or the FIN found the uplink recovering and the ABORT went instead, held
// until the dialer took a FIN that never came ("the dialer took the FIN").
type finThenAbort struct {
	wrapper
	holding    atomic.Bool
	held       chan struct{}
	release    chan struct{}
	pollArmed  atomic.Bool
	finPending atomic.Bool   // the FIN is posted (finQP, finWR): its poll fails
	finQP      atomic.Uint64 // set before finPending
	finWR      atomic.Uint64
	aborted    chan struct{} // closed as the ABORT is asked for
	abortGo    chan struct{}
}

func (k *finThenAbort) Connect(ctx context.Context, dst netip.AddrPort, ex kernel.Exchange, qpn uint32, pd []byte) (kernel.ID, error) {
	var r wire.Req
	if ex == kernel.ExchangeSIDR && wire.DecodeReq(pd, wire.TypeVirtReq, &r) == nil {
		switch {
		case r.Flags&wire.FlagAbort != 0:
			close(k.aborted)
			<-k.abortGo
		case r.Flags&wire.FlagReciprocal != 0 && k.holding.CompareAndSwap(true, false):
			close(k.held)
			<-k.release
		}
	}
	return k.Kernel.Connect(ctx, dst, ex, qpn, pd)
}

func (k *finThenAbort) PostSend(q kernel.QP, wrs []kernel.SendWR) error {
	// Noted before the post: the poller may take the completion before
	// PostSend returns. The kind is read before it too (see finPosted).
	fin := len(wrs) == 1 && len(wrs[0].Payload) > 0 && wrs[0].Payload[0] == kindFIN && k.pollArmed.CompareAndSwap(true, false)
	if fin {
		k.finQP.Store(uint64(q))
		k.finWR.Store(wrs[0].WRID)
		k.finPending.Store(true)
	}
	err := k.Kernel.PostSend(q, wrs)
	if fin && err != nil {
		k.finPending.Store(false)
	}
	return err
}

func (k *finThenAbort) PollSend(ctx context.Context, q kernel.QP, out []kernel.SendCompletion) (int, error) {
	n, err := k.Kernel.PollSend(ctx, q, out)
	if err == nil && k.finPending.Load() && uint64(q) == k.finQP.Load() {
		for _, wc := range out[:n] {
			if wc.WRID == k.finWR.Load() && k.finPending.CompareAndSwap(true, false) {
				return 0, syscall.EIO
			}
		}
	}
	return n, err
}

// A failed half's FIN that went, its completion lost to a failed send poll
// (flushed), and then its ABORT: the dialer gets both, in either order
// (forced here: the ABORT held until the FIN is taken, or the dialer's
// receives paused until the ABORT is answered). FIN first, the dialer's
// connection reads io.EOF, as where the FIN alone goes
// (TestReciprocalAnsweredToFailedHalf), and a message it sent before the
// FIN came went nowhere (the half is gone), as there; ABORT first, it
// fails with the ABORT's error. Either way the connection ends, Accept
// returns nothing, and neither endpoint keeps anything of the dial
// (requireNoLeftovers).
func TestFailedHalfFINThenAbortEitherOrder(t *testing.T) {
	for _, abortFirst := range []bool{false, true} {
		t.Run(fmt.Sprint("abortFirst=", abortFirst), func(t *testing.T) {
			w := newWorld(t)
			a := w.endpoint("10.0.121.1", 7000, longTimers)
			k := &finThenAbort{held: make(chan struct{}), release: make(chan struct{}), aborted: make(chan struct{}), abortGo: make(chan struct{})}
			b := w.wrappedEndpoint("10.0.121.2", 7000, func(kk kernel.Kernel) kernel.Kernel { k.Kernel = kk; return k }, longTimers)
			t.Cleanup(func() {
				for _, ch := range []chan struct{}{k.release, k.abortGo} {
					select {
					case <-ch:
					default:
						close(ch)
					}
				}
			})
			// b's uplink to a's node, over which its reciprocal
			// request goes (virtual) and its FIN to the half.
			p := w.endpoint("10.0.121.1", 7001, longTimers)
			bp, pb := pair(t, b, p)
			// a's INI to b's node carries a leg of a's own, to q, so
			// that b's node keeps the TGT when the failed half lets
			// the dial's forward leg go. Without it the TGT died with
			// the half, and its DREQ to a's INI was news the dialer
			// could take before the reciprocal request: its recovery's
			// MOVE of the dial's leg was refused (BAD_REQUEST), and
			// the dial failed with that ("leg not moved"), neither
			// the FIN nor the ABORT this test is about (3 rounds in
			// 200 under load, 18 in 600 beside a CPU hog).
			q := w.endpoint("10.0.121.2", 7001, longTimers)
			aq, qa := pair(t, a, q)
			k.holding.Store(true)
			dialed := dialLater(t, a, b)
			awaitSetup(t, k.held, "the reciprocal request never came")
			halves := inboundHalves(b)
			if len(halves) != 1 {
				t.Fatalf("setup: %d halves at b", len(halves))
			}
			halves[0].fail(errIdle) // as its idle timeout would, the request on its way
			k.pollArmed.Store(true) // the FIN's completion is lost: flushed (its poll fails)
			rejected := a.Stats().Rejected
			// The FIN waits in a's SRQ until the ABORT is answered
			// (abortFirst) or a's message is posted.
			a.p.PauseReceives()
			t.Cleanup(a.p.ResumeReceives)
			if abortFirst {
				close(k.abortGo)
			}
			close(k.release)
			r := <-dialed
			if r.err != nil {
				if !abortFirst || !errors.Is(r.err, errReverseAborted) {
					t.Fatalf("dial: %v", r.err)
				}
			}
			ctx := ctxT(t, 5*time.Second)
			buf := make([]byte, 64)
			if r.c != nil && !abortFirst {
				// Sent before the FIN is taken, to a half that is
				// gone: posted (the TGT stays, for aq's leg), and
				// dropped there.
				if err := r.c.Send(ctx, []byte("to a half that is gone")); err != nil && !errors.Is(err, ErrPeerGone) {
					t.Fatalf("send before the FIN was taken: %v", err)
				}
				a.p.ResumeReceives()
				eventually(t, "the dialer took the FIN", func() (bool, string) {
					a.mu.Lock()
					defer a.mu.Unlock()
					return r.c.finRcvd, ""
				})
				close(k.abortGo)
			}
			awaitSetup(t, k.aborted, "no ABORT went")
			if r.c != nil {
				eventually(t, "the ABORT answered", func() (bool, string) {
					return a.Stats().Rejected > rejected, ""
				})
				if abortFirst {
					a.p.ResumeReceives()
				}
				_, err := r.c.Recv(ctx, buf)
				switch {
				case abortFirst && !errors.Is(err, errReverseAborted):
					t.Fatalf("ABORT first: Recv says %v, want the ABORT's error", err)
				case !abortFirst && err != io.EOF:
					t.Fatalf("FIN first: Recv says %v, want io.EOF", err)
				case !abortFirst && r.c.Err() != nil:
					t.Fatalf("FIN first: Err says %v, want nil (an orderly end)", r.c.Err())
				}
				r.c.Close()
			}
			requireNoHalfConn(t, b)
			a.p.ResumeReceives() // paused still where the dial failed: aq's close takes qa's FIN
			for _, c := range []*Conn{bp, pb, aq, qa} {
				c.Close()
			}
			requireNoLeftovers(t, a, b, p, q)
			requireReleased(t, w, a, b, p, q)
		})
	}
}

// requireNoLeftovers waits until no endpoint of procs keeps anything of a
// connection: no Conn, dial, booked or reserved tag, registered leg,
// uplink reference or leg, send-queue waiter, or inbound count.
func requireNoLeftovers(t *testing.T, procs ...*proc) {
	t.Helper()
	for _, p := range procs {
		eventually(t, "endpoint "+p.Addr().String()+" keeps nothing", func() (bool, string) {
			p.mu.Lock()
			s := fmt.Sprintf("conns %d pending %d sendTags %d recv %d unaccepted %d", len(p.conns), len(p.pending), len(p.sendTags), len(p.recv), p.unaccepted)
			ok := len(p.conns) == 0 && len(p.pending) == 0 && len(p.sendTags) == 0 && len(p.recv) == 0 && p.unaccepted == 0
			for _, u := range p.uplinks {
				n := 0
				for _, q := range u.inis {
					n += len(q.waiters)
				}
				s += fmt.Sprintf("; uplink %v %v refs %d legs %d waiters %d", u.node, u.state, u.refs, len(u.legs), n)
				ok = ok && u.refs == 0 && len(u.legs) == 0 && n == 0
			}
			p.mu.Unlock()
			// Under view and tagMu, which guard these maps, not mu: a
			// Release that finds mu held leaves its work to mu's holder
			// (runOrLeave), and this check, holding mu without
			// acc.lock, let go of it without running that work. The
			// leg of the connection whose FIN came meanwhile stayed
			// registered, and the check failed on it ("legs 1 ours 1").
			p.acc.view.RLock()
			legs := len(p.acc.legs)
			p.acc.view.RUnlock()
			p.acc.tagMu.Lock()
			ours, reserved := len(p.acc.ours), len(p.acc.reserved)
			p.acc.tagMu.Unlock()
			s += fmt.Sprintf("; legs %d ours %d reserved %d", legs, ours, reserved)
			ok = ok && legs == 0 && ours == 0 && reserved == 0
			return ok, s
		})
	}
}
