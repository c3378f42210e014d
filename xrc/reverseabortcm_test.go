package xrc

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/xrc/internal/wire"
)

// unansweredReverse is a kernel whose requests for a reverse leg (a
// reciprocal REQ, not an ABORT) nobody answers: their first event is
// UNREACHABLE with -ETIMEDOUT, as the real CM's when its retries run out
// (the request, or the dialer's answer, lost on the way).
//
// With answerLost, a reverse leg's virtual request (not a MOVE) reaches the
// dialer, which takes the leg, and only its answer is lost.
type unansweredReverse struct {
	wrapper
	answerLost bool
	ids        idSet
}

func (k *unansweredReverse) Connect(ctx context.Context, dst netip.AddrPort, ex kernel.Exchange, qpNum uint32, pd []byte) (kernel.ID, error) {
	want := wire.TypePhysReq
	if ex == kernel.ExchangeSIDR {
		want = wire.TypeVirtReq
	}
	var r wire.Req
	lost := wire.DecodeReq(pd, want, &r) == nil && r.Flags&wire.FlagReciprocal != 0 && r.Flags&wire.FlagAbort == 0
	if k.answerLost {
		lost = lost && ex == kernel.ExchangeSIDR && r.Flags&wire.FlagMove == 0
	} else if lost {
		// Lost on the way: it goes where nobody listens, and its
		// answer is replaced by the CM's timeout (Event).
		dst = netip.AddrPortFrom(dst.Addr(), 1)
	}
	id, err := k.Kernel.Connect(ctx, dst, ex, qpNum, pd)
	if err == nil && lost {
		k.ids.add(id)
	}
	return id, err
}

func (k *unansweredReverse) Event(ctx context.Context, id kernel.ID) (kernel.Event, error) {
	mine := k.ids.take(id)
	if mine {
		if _, err := k.Kernel.Event(ctx, id); err != nil { // the answer (a refusal where nobody listens), dropped
			return kernel.Event{}, err
		}
		return kernel.Event{Type: kernel.EventUnreachable, ID: id, Status: -int(syscall.ETIMEDOUT)}, nil
	}
	return k.Kernel.Event(ctx, id)
}

// A dial whose acceptor's request for the reverse leg goes unanswered (the
// CM's ETIMEDOUT: the dialer never saw it, so never refused it) fails at
// once on the acceptor's ABORT, as for any failure of the acceptor's own.
// The acceptor took every RejectError for the dialer's refusal and sent no
// ABORT: the dial waited to its deadline.
func TestDialReverseLegUnansweredAborts(t *testing.T) {
	for _, virt := range []bool{false, true} {
		t.Run(fmt.Sprintf("reverse leg virtual %v", virt), func(t *testing.T) {
			w := newWorld(t)
			a := w.endpoint("10.0.102.1", 7000, func(c *Config) { c.HandshakeTimeout = time.Hour })
			k := &unansweredReverse{}
			b := w.wrappedEndpoint("10.0.102.2", 7000, func(kk kernel.Kernel) kernel.Kernel { k.Kernel = kk; return k },
				func(c *Config) { c.HandshakeTimeout = 2 * time.Second })
			// a's uplink to b's node, made for another process there:
			// the dial's forward leg is virtual, its TGT held by that
			// one's leg too, so that b's failed half does not take it
			// down (the dialer would then fail on its recovery).
			o := w.endpoint("10.0.102.2", 7001)
			c, d := pair(t, a, o)
			others := []*Conn{c, d}
			if virt {
				// b's uplink to a's node likewise: b's reverse leg is a
				// VIRT_REQ.
				o := w.endpoint("10.0.102.1", 7001)
				c, d := pair(t, b, o)
				others = append(others, c, d)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			c, err := a.Dial(ctx, b.Addr().String())
			if err == nil {
				c.Close()
				t.Fatal("dial succeeded, though the acceptor's reverse leg request went unanswered")
			}
			if !errors.Is(err, errReverseAborted) {
				t.Fatalf("dial failed with %v; want the acceptor's ABORT", err)
			}
			requireNoHalfConn(t, b)
			for _, c := range others {
				c.Close()
			}
			requireReleased(t, w, a, b)
		})
	}
}
