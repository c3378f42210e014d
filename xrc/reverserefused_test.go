package xrc

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/xrc/internal/wire"
)

// failTGT, once armed, fails the next CreateTGT with ENOMEM: the node is
// out of QPs as the acceptor's reciprocal PHYS_REQ comes.
type failTGT struct {
	wrapper
	armed atomic.Bool
}

func (k *failTGT) CreateTGT(d kernel.XRCD) (kernel.QP, uint32, error) {
	if k.armed.CompareAndSwap(true, false) {
		return 0, 0, syscall.ENOMEM
	}
	return k.Kernel.CreateTGT(d)
}

// A dial whose acceptor's reciprocal PHYS_REQ the dialer refuses (its
// CreateTGT fails: BUSY_RETRY). The acceptor does not ask again (since
// version 4) and its half fails; the dialer heard nothing of it. Where
// another process of the acceptor's node kept the dialer's uplink there
// alive, its Dial waited to its deadline (the handshake timeout) and
// failed with context.DeadlineExceeded; where the dial's leg was the
// uplink's only one, the acceptor's TGT went with its half, and the dial
// failed on the recovery that followed, naming that ("leg not moved:
// BAD_REQUEST"). It fails at once now, saying why.
func TestDialReverseLegRefusedFailsAtOnce(t *testing.T) {
	for _, shared := range []bool{false, true} {
		t.Run(fmt.Sprintf("uplink shared %v", shared), func(t *testing.T) {
			w := newWorld(t)
			g := &failTGT{}
			a := w.wrappedEndpoint("10.0.99.1", 7000, func(k kernel.Kernel) kernel.Kernel { g.Kernel = k; return g })
			ab := &abortCount{}
			b := w.wrappedEndpoint("10.0.99.2", 7000, func(k kernel.Kernel) kernel.Kernel { ab.Kernel = k; return ab })
			var others []*Conn
			if shared {
				// a's uplink to b's node, kept by another process
				// there, which b has no uplink of its own from.
				o := w.endpoint("10.0.99.2", 7001)
				c, d := pair(t, a, o)
				others = append(others, c, d)
			}
			g.armed.Store(true) // a makes no TGT but for b's reciprocal PHYS_REQ
			start := time.Now()
			c, err := a.Dial(context.Background(), b.Addr().String()) // bounded by the handshake timeout
			if err == nil {
				c.Close()
				t.Fatal("dial succeeded, though its reverse leg was refused")
			}
			if !errors.Is(err, errReverseRefused) || !errors.Is(err, syscall.ENOMEM) {
				t.Fatalf("dial failed after %v with %v; want its reverse leg refused (ENOMEM)", time.Since(start).Round(time.Millisecond), err)
			}
			if g.armed.Load() {
				t.Fatal("setup: no TGT was asked for")
			}
			requireNoHalfConn(t, b)
			for _, c := range others {
				c.Close()
			}
			requireReleased(t, w, a, b)
			// After a refusal that failed the dial, b's ABORT could
			// overtake that failure, naming the wrong reason (once in
			// a CI run under -race): b sends none.
			if n := ab.n.Load(); n != 0 {
				t.Fatalf("the acceptor sent %d ABORTs for a reverse leg the dialer refused", n)
			}
		})
	}
}

// abortCount counts the ABORTs its process sends.
type abortCount struct {
	wrapper
	n atomic.Int32
}

func (k *abortCount) Connect(ctx context.Context, dst netip.AddrPort, ex kernel.Exchange, qpNum uint32, pd []byte) (kernel.ID, error) {
	var r wire.Req
	if ex == kernel.ExchangeSIDR && wire.DecodeReq(pd, wire.TypeVirtReq, &r) == nil && r.Flags&wire.FlagAbort != 0 {
		k.n.Add(1)
	}
	return k.Kernel.Connect(ctx, dst, ex, qpNum, pd)
}

// A refused request that names a pending dial cannot fail it from another
// node than the dialed one, nor from the dialed node naming another tag:
// the dial's own reciprocal request, held meanwhile, completes it.
func TestDialStrayRefusedReciprocalIgnored(t *testing.T) {
	w := newWorld(t)
	a, b, _, rk := holdingPair(t, w, "10.0.100")
	rk.armed.Store(true)
	dialed := dialLater(t, a, b)
	awaitSetup(t, rk.held, "the reciprocal request never came")
	var tag uint32
	a.mu.Lock()
	for tg, c := range a.pending {
		if !c.inbound {
			tag = tg
		}
	}
	a.mu.Unlock()
	if tag == 0 {
		t.Fatal("setup: no pending dial")
	}
	for _, s := range []struct {
		ip  string
		tag uint32
	}{{"10.0.100.3", tag}, {b.Addr().Addr().String(), tag ^ 1}} {
		k := w.rawKernel(s.ip)
		_, ini, err := k.CreateINI()
		if err != nil {
			t.Fatal(err)
		}
		// Refused BAD_REQUEST (its INI QPN is not the CM's), which the
		// acceptor would not ask again.
		r := wire.Req{Type: wire.TypePhysReq, Flags: wire.FlagReciprocal, ConnTag: 99, PeerTag: s.tag, Incarnation: 0xE71,
			INIQPN: ini + 1, SRQN: 0x30, ReplyPort: 9, Credits: 8, MaxMessage: MaxMessageSize}
		ev := answer(t, k, a.Addr(), kernel.ExchangeXRC, ini, encodeReq(t, r))
		var rej wire.Reject
		if ev.Type != kernel.EventRejected || wire.DecodeReject(ev.PrivateData, &rej) != nil || rej.Reason != wire.RejectBadRequest {
			t.Fatalf("%s naming %#x: %v %x, want REJECT(BAD_REQUEST)", s.ip, s.tag, ev.Type, ev.PrivateData)
		}
	}
	close(rk.release)
	c, d := upBothWays(t, dialed, b)
	c.Close()
	d.Close()
}
