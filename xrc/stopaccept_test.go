package xrc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// StopAccepting ends an endpoint's listening part only: a connection made
// and not yet accepted is closed (its dialer reads EOF), Accept returns
// ErrClosed, a new dial is refused (ECONNREFUSED) with no count changed,
// and the accepted connection goes on both ways, as does the endpoint's own
// dial, until their Close. Then everything is released.
func TestEndpointStopAccepting(t *testing.T) {
	w := newWorld(t)
	a := w.endpoint("10.0.70.1", 7000)
	b := w.endpoint("10.0.70.2", 7000)
	c1, s1 := pair(t, b, a)       // accepted on a
	out, outPeer := pair(t, a, b) // a's own dial
	queued := dialQueued(t, b, a)

	a.StopAccepting()
	a.StopAccepting() // idempotent
	if _, err := a.Accept(ctxT(t, time.Second)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after StopAccepting: %v, want ErrClosed", err)
	}
	if n, err := queued.Recv(ctxT(t, 5*time.Second), make([]byte, 64)); err != io.EOF {
		t.Fatalf("the connection not accepted: Recv %d, %v; want EOF (closed by its acceptor)", n, err)
	}
	queued.Close()
	eventually(t, "the unaccepted connection gone", func() (bool, string) {
		st := a.Stats()
		return st.Conns == 2, fmt.Sprintf("%+v", st)
	})

	sidrIDsDestroyed(t, a) // its own dial's
	before := a.Stats()
	_, err := b.Dial(ctxT(t, 5*time.Second), a.Addr().String())
	var rj *RejectError
	if !errors.As(err, &rj) || rj.Reason != RejectApp || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial after StopAccepting: %v, want APP_REJECT matching ECONNREFUSED", err)
	}
	eventually(t, "the refused dial changed no count", func() (bool, string) {
		st := a.Stats()
		ok := st.Conns == before.Conns && st.Downlinks == before.Downlinks && st.LocalCounts == before.LocalCounts &&
			st.KernelHandles == before.KernelHandles && st.Rejected == before.Rejected+1
		return ok, fmt.Sprintf("%+v (was %+v)", st, before)
	})

	for i := range 3 {
		roundTrip(t, c1, s1, []byte(fmt.Sprint("to a ", i)))
		roundTrip(t, s1, c1, []byte(fmt.Sprint("to b ", i)))
		roundTrip(t, out, outPeer, []byte(fmt.Sprint("a's dial ", i)))
		roundTrip(t, outPeer, out, []byte(fmt.Sprint("a's dial back ", i)))
	}
	s1.Close()
	if _, err := c1.Recv(ctxT(t, 5*time.Second), make([]byte, 64)); err != io.EOF {
		t.Fatalf("after the accepted connection's Close: %v, want EOF", err)
	}
	c1.Close()
	out.Close()
	outPeer.Close()
	requireReleased(t, w, a, b)
}

// dialQueued dials a from b and waits until the connection is a's only
// one waiting for Accept.
func dialQueued(t *testing.T, b, a *proc) *Conn {
	t.Helper()
	c, err := b.Dial(ctxT(t, 5*time.Second), a.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "the connection waits for Accept", func() (bool, string) {
		return len(a.acceptq) == 1, fmt.Sprint(len(a.acceptq))
	})
	return c
}

// A pending Accept returns ErrClosed when StopAccepting comes.
func TestEndpointStopAcceptingWakesAccept(t *testing.T) {
	w := newWorld(t)
	a := w.endpoint("10.0.71.1", 7000)
	done := make(chan error, 1)
	go func() {
		_, err := a.Accept(ctxT(t, 10*time.Second))
		done <- err
	}()
	time.Sleep(20 * time.Millisecond)
	a.StopAccepting()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("pending Accept: %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("StopAccepting did not wake the pending Accept")
	}
}

// ResumeAccepting undoes StopAccepting: an Accept that StopAccepting ended
// stays ended, a new dial is accepted again, and the connection accepted
// before the stop goes on.
func TestEndpointResumeAccepting(t *testing.T) {
	w := newWorld(t)
	a := w.endpoint("10.0.73.1", 7000)
	b := w.endpoint("10.0.73.2", 7000)
	c1, s1 := pair(t, b, a)
	a.ResumeAccepting() // not stopped: nothing to undo
	a.StopAccepting()
	if _, err := b.Dial(ctxT(t, 5*time.Second), a.Addr().String()); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial while stopped: %v, want ECONNREFUSED", err)
	}
	a.ResumeAccepting()
	c2, s2 := pair(t, b, a)
	for i, p := range [][2]*Conn{{c1, s1}, {c2, s2}} {
		roundTrip(t, p[0], p[1], []byte(fmt.Sprint("to a ", i)))
		roundTrip(t, p[1], p[0], []byte(fmt.Sprint("to b ", i)))
	}
	a.StopAccepting()
	if _, err := a.Accept(ctxT(t, time.Second)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after the second StopAccepting: %v, want ErrClosed", err)
	}
	for _, c := range []*Conn{c1, s1, c2, s2} {
		c.Close()
	}
	requireReleased(t, w, a, b)
}

// An Accept within a term that has ended returns ErrClosed and takes no
// connection of the next term, which that term's Accept gets.
func TestEndpointAcceptInEndedTerm(t *testing.T) {
	w := newWorld(t)
	a := w.endpoint("10.0.74.1", 7000)
	b := w.endpoint("10.0.74.2", 7000)
	first := a.Term()
	a.StopAccepting()
	second := a.ResumeAccepting()
	c := dialQueued(t, b, a)
	defer c.Close()
	if _, err := a.AcceptIn(ctxT(t, time.Second), first); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept in the ended term: %v, want ErrClosed", err)
	}
	s, err := a.AcceptIn(ctxT(t, 5*time.Second), second)
	if err != nil {
		t.Fatalf("Accept in the current term: %v", err)
	}
	defer s.Close()
	roundTrip(t, c, s, []byte("the second term's"))
}

// The zero AcceptTerm has ended: AcceptIn returns ErrClosed at once (it
// waited for its context, or took a connection and put it back).
func TestEndpointAcceptInZeroTerm(t *testing.T) {
	w := newWorld(t)
	a := w.endpoint("10.0.75.1", 7000)
	if _, err := a.AcceptIn(ctxT(t, 5*time.Second), AcceptTerm{}); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("AcceptIn(zero term): %v, want ErrClosed", err)
	}
}

// A connection made in a term that ended while an Accept of that term was
// taking it is closed, as StopAccepting closes those it finds queued, even
// when a new term has begun: it is not handed to the new term's Accept.
func TestEndpointConnOfEndedTermClosed(t *testing.T) {
	w := newWorld(t)
	a := w.endpoint("10.0.76.1", 7000)
	b := w.endpoint("10.0.76.2", 7000)
	first := a.Term()
	c := dialQueued(t, b, a)
	defer c.Close()
	// The Accept takes the connection off the queue and waits for the
	// lock, under which the term ends and the next begins.
	a.mu.Lock()
	done := make(chan error, 1)
	go func() {
		_, err := a.AcceptIn(ctxT(t, 5*time.Second), first)
		done <- err
	}()
	for len(a.acceptq) != 0 {
		time.Sleep(time.Millisecond)
	}
	a.stopAcceptingLocked()
	a.resumeAcceptingLocked()
	a.mu.Unlock()
	if err := <-done; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept in the ended term: %v, want ErrClosed", err)
	}
	if s, err := a.Accept(ctxT(t, 300*time.Millisecond)); err == nil {
		s.Close()
		t.Fatal("the new term's Accept got a connection of the ended one")
	}
	if n, err := c.Recv(ctxT(t, 5*time.Second), make([]byte, 64)); err != io.EOF {
		t.Fatalf("the dialer of the closed connection: Recv %d, %v; want EOF", n, err)
	}
}

// unanswered is a kernel whose connection requests (of the exchange ex, or
// of any once all is set) nobody answers: their first event is UNREACHABLE
// with -ETIMEDOUT, as the real CM's when its retries run out; or, with
// first set, that event. n counts them.
type unanswered struct {
	kernel.Kernel
	ex    kernel.Exchange
	all   atomic.Bool
	first kernel.EventType
	n     atomic.Int32
	ids   idSet
}

// idSet is a set of CM ids, safe for concurrent use; the zero value is
// empty.
type idSet struct {
	mu  sync.Mutex
	ids map[kernel.ID]bool
}

func (s *idSet) add(id kernel.ID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ids == nil {
		s.ids = map[kernel.ID]bool{}
	}
	s.ids[id] = true
}

// take reports whether id is in the set, and takes it out.
func (s *idSet) take(id kernel.ID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	mine := s.ids[id]
	delete(s.ids, id)
	return mine
}

// unansweredAfterPollFail is an endpoint at ip:7000 (longTimers) whose
// kernel fails a send poll once pf is armed (a recovery begins) and leaves
// unanswered every connection request begun once u.all is set: a
// recovery's MOVE that the CM times out.
func (w *world) unansweredAfterPollFail(ip string) (*proc, *unanswered, *pollFail) {
	u := &unanswered{}
	pf := &pollFail{Kernel: u}
	return w.wrappedEndpoint(ip, 7000, func(in kernel.Kernel) kernel.Kernel { u.Kernel = in; return pf }, longTimers), u, pf
}

func (u *unanswered) Connect(ctx context.Context, dst netip.AddrPort, ex kernel.Exchange, qpNum uint32, pd []byte) (kernel.ID, error) {
	id, err := u.Kernel.Connect(ctx, dst, ex, qpNum, pd)
	if err == nil && (ex == u.ex || u.all.Load()) {
		u.n.Add(1)
		u.ids.add(id)
	}
	return id, err
}

func (u *unanswered) Event(ctx context.Context, id kernel.ID) (kernel.Event, error) {
	mine := u.ids.take(id)
	if mine && u.first != 0 {
		return kernel.Event{Type: u.first, ID: id}, nil
	}
	if mine {
		return kernel.Event{Type: kernel.EventUnreachable, ID: id, Status: -int(syscall.ETIMEDOUT)}, nil
	}
	return u.Kernel.Event(ctx, id)
}

// A connection request nobody answers, physical (the first to a node) or
// virtual, fails Dial with an error that matches syscall.ETIMEDOUT and is a
// net.Error timeout: the physical one was an untyped "unexpected
// UNREACHABLE".
func TestDialUnansweredIsTimeout(t *testing.T) {
	for _, ex := range []kernel.Exchange{kernel.ExchangeXRC, kernel.ExchangeSIDR} {
		t.Run(ex.String(), func(t *testing.T) {
			w := newWorld(t)
			srv := w.endpoint("10.0.72.1", 7000)
			u := &unanswered{ex: ex}
			cli := w.wrappedEndpoint("10.0.72.2", 7000, func(k kernel.Kernel) kernel.Kernel { u.Kernel = k; return u })
			if ex == kernel.ExchangeSIDR {
				pair(t, cli, srv) // an uplink first: the next dial is virtual
			}
			_, err := cli.Dial(ctxT(t, 5*time.Second), srv.Addr().String())
			var ne net.Error
			if !errors.Is(err, syscall.ETIMEDOUT) || !errors.As(err, &ne) || !ne.Timeout() {
				t.Fatalf("unanswered %v request: %v, want a timeout matching ETIMEDOUT", ex, err)
			}
			if errors.Is(err, syscall.ECONNREFUSED) {
				t.Fatalf("unanswered %v request matches ECONNREFUSED: %v", ex, err)
			}
		})
	}
}

// A request answered by an event no exchange expects fails Dial with the
// event named and the peer named once: it read "xrc: dial A: xrc: connect
// A: unexpected ...", the link's exchange wrapped in the Dial's.
func TestDialUnexpectedEventNamedOnce(t *testing.T) {
	for _, ex := range []kernel.Exchange{kernel.ExchangeXRC, kernel.ExchangeSIDR} {
		t.Run(ex.String(), func(t *testing.T) {
			w := newWorld(t)
			srv := w.endpoint("10.0.77.1", 7000)
			u := &unanswered{ex: ex, first: kernel.EventDisconnected}
			cli := w.wrappedEndpoint("10.0.77.2", 7000, func(k kernel.Kernel) kernel.Kernel { u.Kernel = k; return u })
			if ex == kernel.ExchangeSIDR {
				pair(t, cli, srv)
			}
			_, err := cli.Dial(ctxT(t, 5*time.Second), srv.Addr().String())
			want := "xrc: dial " + srv.Addr().String() + ": unexpected DISCONNECTED"
			if err == nil || err.Error() != want {
				t.Fatalf("Dial: %v, want %q", err, want)
			}
			var oe *OpError
			if !errors.As(err, &oe) || oe.Op != "dial" {
				t.Fatalf("Dial: %#v, want an *OpError of dial", err)
			}
		})
	}
}

// heldSends is a kernel whose PostSends wait, while holding is set, until
// release is closed.
type heldSends struct {
	kernel.Kernel
	holding atomic.Bool
	release chan struct{}
}

func (h *heldSends) PostSend(q kernel.QP, wrs []kernel.SendWR) error {
	if h.holding.Load() {
		<-h.release
	}
	return h.Kernel.PostSend(q, wrs)
}

// A connection whose legs come up only after StopAccepting is closed when
// it becomes ready, never queued for an Accept: its dialer reads EOF. The
// acceptor, which has an uplink to the dialer already, carries the reverse
// leg in its ACCEPT and waits for the dialer's first frame, which the
// dialer's kernel holds back here until the acceptor has stopped.
func TestEndpointConnReadyAfterStopAcceptingClosed(t *testing.T) {
	w := newWorld(t)
	a := w.endpoint("10.0.78.1", 7000)
	h := &heldSends{release: make(chan struct{})}
	b := w.wrappedEndpoint("10.0.78.2", 7000, func(k kernel.Kernel) kernel.Kernel { h.Kernel = k; return h })
	var once sync.Once
	release := func() { once.Do(func() { close(h.release) }) }
	t.Cleanup(release)            // before the endpoints close (cleanups run last first)
	out, outPeer := pair(t, a, b) // a's uplink to b: b's next dial is one exchange
	defer out.Close()
	defer outPeer.Close()
	h.holding.Store(true)
	dialed := make(chan *Conn, 1)
	go func() {
		c, err := b.Dial(ctxT(t, 5*time.Second), a.Addr().String())
		if err != nil {
			t.Errorf("dial: %v", err)
		}
		dialed <- c
	}()
	eventually(t, "the inbound connection made, waiting for its first frame", func() (bool, string) {
		a.mu.Lock()
		defer a.mu.Unlock()
		waiting := 0
		for c := range a.conns {
			if c.inbound && c.awaitFirst {
				waiting++
			}
		}
		return waiting == 1, fmt.Sprintf("%d waiting, %d queued", waiting, len(a.acceptq))
	})
	a.StopAccepting()
	release()
	c := <-dialed
	if c == nil {
		t.FailNow()
	}
	defer c.Close()
	if n, err := c.Recv(ctxT(t, 5*time.Second), make([]byte, 64)); err != io.EOF {
		t.Fatalf("the dialer: Recv %d, %v; want EOF (closed by its acceptor when it became ready)", n, err)
	}
	if _, err := a.Accept(ctxT(t, time.Second)); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept: %v, want ErrClosed", err)
	}
	roundTrip(t, out, outPeer, []byte("the accepted one goes on"))
}
