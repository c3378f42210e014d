package xrc

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// recoverDuringAccept, once armed, fails every INI of e as the answer to
// the next SIDR exchange arrives (a dial's forward ACCEPT read while its
// uplink recovers), and holds the recovery's PHYS_REQ until release is
// closed.
type recoverDuringAccept struct {
	wrapper
	e       *Endpoint
	armed   atomic.Bool
	hold    atomic.Bool
	release chan struct{}
	sidr    atomic.Uint64
}

func (k *recoverDuringAccept) Connect(ctx context.Context, dst netip.AddrPort, ex kernel.Exchange, qpn uint32, pd []byte) (kernel.ID, error) {
	if ex == kernel.ExchangeXRC && k.hold.Load() {
		<-k.release
	}
	id, err := k.Kernel.Connect(ctx, dst, ex, qpn, pd)
	if err == nil && ex == kernel.ExchangeSIDR && k.armed.CompareAndSwap(true, false) {
		k.sidr.Store(uint64(id))
	}
	return id, err
}

func (k *recoverDuringAccept) Event(ctx context.Context, id kernel.ID) (kernel.Event, error) {
	ev, err := k.Kernel.Event(ctx, id)
	if err == nil && uint64(id) != 0 && k.sidr.CompareAndSwap(uint64(id), 0) {
		e := k.e
		e.mu.Lock()
		for _, u := range e.uplinks {
			if u.cur != nil {
				k.hold.Store(true)
				e.failINILocked(u, u.cur)
			}
		}
		e.mu.Unlock()
	}
	return ev, err
}

// twoExchangeInRecovery starts a dial from a to b whose reverse leg comes by
// its own exchange, and whose forward ACCEPT is read while a's uplink
// recovers: the recovery waits for release. c and d are a connection
// made before, which the recovery moves.
func twoExchangeInRecovery(t *testing.T, w *world, ip string) (a, b *proc, c, d *Conn, release func()) {
	g := &recoverDuringAccept{release: make(chan struct{})}
	a = w.wrappedEndpoint(ip+".1", 7000, func(k kernel.Kernel) kernel.Kernel { g.Kernel = k; return g })
	g.e = a.Endpoint
	b = w.endpoint(ip+".2", 7000)
	release = sync.OnceFunc(func() { close(g.release) })
	t.Cleanup(release) // before the endpoints close
	c, d = pair(t, a, b)
	g.armed.Store(true)
	return a, b, c, d, release
}

// A dial whose reverse leg comes by its own exchange reads its forward
// ACCEPT while its uplink recovers, and waits to move its leg. The
// acceptor's reciprocal request comes meanwhile and is taken. The dial's
// deadline then passes before its forward leg is bound, and it fails
// without a FIN (it has no leg to send one on). Until protocol version 4
// the taken reciprocal leg completed the acceptor's half, and Accept
// returned a connection whose dialer was gone, silent until its idle
// timeout or the old link's DREQ (stop 51 refused the reciprocal request
// until the leg was bound instead). Now the acceptor's half is up only at
// the dialer's first frame, which a dial given up never sends.
func TestTwoExchangeDialGivenUpInRecoveryLeavesNoHalfConn(t *testing.T) {
	w := newWorld(t)
	a, b, c0, d0, release := twoExchangeInRecovery(t, w, "10.0.94")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	c, err := a.dialOnce(ctx, b.Addr(), true)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("dial: %v (a connection: %v), want its deadline: the recovery is held", err, c != nil)
	}
	requireNoHalfConn(t, b)
	release() // (held this long, the recovery may fail c0's leg)
	c0.Close()
	d0.Close()
	requireReleased(t, w, a, b)
}

// The same dial, whose recovery ends within its deadline: the reciprocal
// leg, taken while the forward leg waited, is refused nothing; the
// acceptor's half waits for the dialer's first frame, and the connection
// is up both ways.
func TestTwoExchangeDialWaitsOutRecovery(t *testing.T) {
	w := newWorld(t)
	a, b, c0, d0, release := twoExchangeInRecovery(t, w, "10.0.95")
	before := a.Stats()
	dialed := dialLater(t, a, b)
	eventually(t, "the reciprocal leg taken while the forward leg waits", func() (bool, string) {
		st := a.Stats()
		return st.LocalCounts > before.LocalCounts, fmt.Sprintf("%+v", st)
	})
	if d, err := b.Accept(ctxT(t, 100*time.Millisecond)); err == nil {
		t.Fatalf("Accept returned %v before the dialer's forward leg was bound", d.RemoteAddr())
	}
	release()
	c, d := upBothWays(t, dialed, b)
	if got := a.Stats().Rejected; got != before.Rejected {
		t.Errorf("the dialer refused %d requests", got-before.Rejected)
	}
	c.Close()
	d.Close()
	c0.Close()
	d0.Close()
	requireReleased(t, w, a, b)
}

// acceptReadLate holds, once armed, the read of the answer to e's next
// SIDR exchange (a dial's forward ACCEPT) until e has taken a request: the
// acceptor's reciprocal request overtakes the dialer's read of its ACCEPT,
// as it often does on a healthy uplink.
type acceptReadLate struct {
	wrapper
	armed atomic.Bool
	sidr  atomic.Uint64
	watch atomic.Bool // from the arming on (pair's own legs are taken too)
	taken chan struct{}
	once  sync.Once
}

func (k *acceptReadLate) Connect(ctx context.Context, dst netip.AddrPort, ex kernel.Exchange, qpn uint32, pd []byte) (kernel.ID, error) {
	id, err := k.Kernel.Connect(ctx, dst, ex, qpn, pd)
	if err == nil && ex == kernel.ExchangeSIDR && k.armed.CompareAndSwap(true, false) {
		k.sidr.Store(uint64(id))
	}
	return id, err
}

func (k *acceptReadLate) Event(ctx context.Context, id kernel.ID) (kernel.Event, error) {
	ev, err := k.Kernel.Event(ctx, id)
	if err == nil && uint64(id) != 0 && k.sidr.CompareAndSwap(uint64(id), 0) {
		select {
		case <-k.taken:
		case <-time.After(time.Second): // not taken: the test says so
		}
	}
	return ev, err
}

func (k *acceptReadLate) Accept(id kernel.ID, qpn uint32, pd []byte) error {
	err := k.Kernel.Accept(id, qpn, pd)
	if k.watch.Load() {
		k.once.Do(func() { close(k.taken) })
	}
	return err
}

// A two-exchange dial over healthy uplinks whose acceptor's reciprocal
// request comes before the dialer has read its ACCEPT (the two race on
// every such dial; in the model the request wins most of them) has its
// reverse leg taken at once, and the connection comes up both ways. In
// stop 51 the dialer refused such a request (BUSY_RETRY) and the acceptor
// asked again after a millisecond or more: a refusal counted in
// Stats.Rejected and a new TGT handle made and released on every such dial.
func TestTwoExchangeReciprocalOvertakingAcceptTaken(t *testing.T) {
	w := newWorld(t)
	g := &acceptReadLate{taken: make(chan struct{})}
	a := w.wrappedEndpoint("10.0.96.1", 7000, func(k kernel.Kernel) kernel.Kernel { g.Kernel = k; return g })
	b := w.endpoint("10.0.96.2", 7000)
	c0, d0 := pair(t, a, b) // the uplinks both ways, healthy
	rejected := a.Stats().Rejected
	g.watch.Store(true)
	g.armed.Store(true)
	dialed := dialLater(t, a, b)
	d, err := b.Accept(ctxT(t, 5*time.Second))
	if err != nil {
		t.Fatalf("accept: %v", err)
	}
	r := <-dialed
	if r.err != nil {
		t.Fatalf("dial: %v", r.err)
	}
	if got := a.Stats().Rejected; got != rejected {
		t.Fatalf("the dialer refused %d requests", got-rejected)
	}
	select {
	case <-g.taken:
	default:
		t.Fatal("the dialer took no request while its ACCEPT was unread")
	}
	roundTrip(t, r.c, d, []byte("forward"))
	roundTrip(t, d, r.c, []byte("reverse"))
	for _, c := range []*Conn{r.c, d, c0, d0} {
		c.Close()
	}
	requireReleased(t, w, a, b)
}
