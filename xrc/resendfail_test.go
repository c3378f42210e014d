package xrc

import (
	"context"
	"errors"
	"net/netip"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/goxrc/goxrc/internal/kernel"
)

// failKeepalives, once armed, fails every post of a lone keepalive (EINVAL,
// as a post to an INI that failed may) until release is closed, and holds
// the first physical link's Connect (a recovery's PHYS_REQ) begun after the
// second such failure until then.
type failKeepalives struct {
	wrapper
	armed   atomic.Bool
	n       atomic.Int32
	holding atomic.Bool
	held    chan struct{}
	release chan struct{}
}

func (k *failKeepalives) PostSend(q kernel.QP, wrs []kernel.SendWR) error {
	if k.armed.Load() && len(wrs) == 1 && len(wrs[0].Payload) == 1 && wrs[0].Payload[0] == kindHeartbeat {
		select {
		case <-k.release:
		default:
			if k.n.Add(1) == 2 {
				k.holding.Store(true)
			}
			return syscall.EINVAL
		}
	}
	return k.Kernel.PostSend(q, wrs)
}

func (k *failKeepalives) Connect(ctx context.Context, dst netip.AddrPort, ex kernel.Exchange, qpn uint32, pd []byte) (kernel.ID, error) {
	if ex == kernel.ExchangeXRC && k.holding.CompareAndSwap(true, false) {
		close(k.held)
		<-k.release
	}
	return k.Kernel.Connect(ctx, dst, ex, qpn, pd)
}

// A one-exchange dial whose first frame's post fails (its uplink recovers)
// and whose recovery's keepalive, the first frame sent again (firstDue),
// fails to post too; the dial's context ends while the next recovery is
// under way. No keepalive went, so the dial is given up (abortFirst) and
// its FIN is the acceptor's half's first frame: Dial fails with its
// context's error and Accept returns nothing. Conn.resend counted its
// keepalive before posting it and kept it counted when the post failed:
// abortFirst took the dial for committed, and Dial returned a connection
// after its context had ended.
func TestDialResendKeepaliveNotPostedIsNoFirstFrame(t *testing.T) {
	w := newWorld(t)
	k := &failKeepalives{held: make(chan struct{}), release: make(chan struct{})}
	t.Cleanup(func() {
		select {
		case <-k.release:
		default:
			close(k.release)
		}
	})
	a := w.wrappedEndpoint("10.0.122.1", 7000, func(kk kernel.Kernel) kernel.Kernel { k.Kernel = kk; return k }, longTimers)
	b := w.endpoint("10.0.122.2", 7000, longTimers)
	ca, cb := pair(t, a, b) // uplinks both ways: the next dial takes one exchange
	defer ca.Close()
	defer cb.Close()
	k.armed.Store(true) // the first frame's post, then the recovery's keepalive, ...
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	type res struct {
		c   *Conn
		err error
	}
	dialed := make(chan res, 1)
	go func() {
		c, err := a.Dial(ctx, b.Addr().String())
		dialed <- res{c, err}
	}()
	awaitSetup(t, k.held, "no second recovery")
	cancel()
	r := <-dialed
	close(k.release)
	if r.err == nil {
		r.c.Close()
		t.Fatal("Dial returned a connection after its context ended, though no first frame went")
	}
	if !errors.Is(r.err, context.Canceled) {
		t.Fatalf("dial: %v, want its context's end", r.err)
	}
	requireNoHalfConn(t, b)
}
