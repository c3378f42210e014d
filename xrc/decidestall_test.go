package xrc

import (
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// slowTGT holds CreateTGT back until release is closed, once armed: a
// device whose firmware takes its time over a new QP.
type slowTGT struct {
	kernel.Kernel
	armed   chan struct{} // closed to arm
	entered chan struct{} // closed when an armed CreateTGT began
	release chan struct{}
}

func (k *slowTGT) CreateTGT(d kernel.XRCD) (kernel.QP, uint32, error) {
	select {
	case <-k.armed:
		close(k.entered)
		<-k.release
	default:
	}
	return k.Kernel.CreateTGT(d)
}

// While a new sender's request waits on the device for its TGT, messages on
// the connections already there keep arriving: the decision holds the
// acceptor's lock across its kernel calls, and the receive loop's check of
// each message took that lock too. So did the janitor's linger pass (every
// IdleTimeout/4, under the endpoint's lock, which delivery takes): the
// message is sent once that pass has come during the decision (a flake of
// this test under a loaded -race run, 1 in 3, where delivery was slower
// than the pass).
func TestDecisionDoesNotStallReceive(t *testing.T) {
	w := newWorld(t)
	slow := &slowTGT{armed: make(chan struct{}), entered: make(chan struct{}), release: make(chan struct{})}
	r := w.wrappedEndpoint("10.0.78.2", 7001, func(k kernel.Kernel) kernel.Kernel { slow.Kernel = k; return slow })
	s, third := w.endpoint("10.0.78.1", 7000), w.endpoint("10.0.78.3", 7000)
	sc, rc := pair(t, s, r)
	close(slow.armed)
	dialed := make(chan error, 1)
	go func() {
		c, err := third.Dial(ctxT(t, 10*time.Second), r.Addr().String())
		if err == nil {
			c.Close()
		}
		dialed <- err
	}()
	select {
	case <-slow.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the third node's request never reached CreateTGT")
	}
	released := false
	defer func() {
		if !released {
			close(slow.release)
		}
	}()
	time.Sleep(2 * testIdle / 4) // the janitor's linger pass comes (lingerEvery)
	if err := sc.Send(ctxT(t, time.Second), []byte("while a decision waits")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	type result struct {
		n   int
		err error
	}
	got := make(chan result, 1)
	rctx := ctxT(t, 2*time.Second)
	go func() {
		n, err := rc.Recv(rctx, buf)
		got <- result{n, err}
	}()
	var n int
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("a message on an established connection, while another sender's TGT is being made: %v", r.err)
		}
		n = r.n
	case <-time.After(5 * time.Second):
		// Recv waits for the endpoint's lock before it looks at its
		// context: the lock's holder waits for the decision.
		t.Fatal("Recv hangs past its context's deadline while another sender's TGT is being made")
	}
	if string(buf[:n]) != "while a decision waits" {
		t.Fatalf("received %q", buf[:n])
	}
	released = true
	close(slow.release)
	if err := <-dialed; err != nil {
		t.Fatalf("the dial whose TGT was held back: %v", err)
	}
}

// A connection that ends while another sender's request waits on the
// device for its TGT releases its receiving leg under the endpoint's lock;
// the release took the acceptor's lock, which the decision holds across
// CreateTGT. The endpoint's lock was held until the device answered:
// nothing was delivered on the connections still there, and Recv could not
// end at its deadline.
func TestConnEndDuringDecisionDoesNotStallReceive(t *testing.T) {
	w := newWorld(t)
	slow := &slowTGT{armed: make(chan struct{}), entered: make(chan struct{}), release: make(chan struct{})}
	r := w.wrappedEndpoint("10.0.79.2", 7001, func(k kernel.Kernel) kernel.Kernel { slow.Kernel = k; return slow })
	s, u, third := w.endpoint("10.0.79.1", 7000), w.endpoint("10.0.79.4", 7000), w.endpoint("10.0.79.3", 7000)
	sc, src := pair(t, s, r) // ends during the decision
	uc, urc := pair(t, u, r) // stays, and must still receive
	close(slow.armed)
	dialed := make(chan error, 1)
	go func() {
		c, err := third.Dial(ctxT(t, 10*time.Second), r.Addr().String())
		if err == nil {
			c.Close()
		}
		dialed <- err
	}()
	select {
	case <-slow.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("the third node's request never reached CreateTGT")
	}
	released := false
	defer func() {
		if !released {
			close(slow.release)
		}
	}()
	// The peer's FIN ends src's receiving leg: its release comes during
	// the decision.
	closed := make(chan error, 1)
	go func() { closed <- sc.Close() }()
	buf := make([]byte, 64)
	type result struct {
		n   int
		err error
	}
	got := make(chan result, 1)
	go func() {
		n, err := src.Recv(ctxT(t, 2*time.Second), make([]byte, 64))
		got <- result{n, err}
	}()
	select {
	case r := <-got:
		if r.err != io.EOF {
			t.Fatalf("the closed connection's Recv: %d, %v, want io.EOF", r.n, r.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Recv on the connection whose peer closed hangs past its deadline while another sender's TGT is being made")
	}
	time.Sleep(50 * time.Millisecond) // its FIN consumed, its leg released
	if err := uc.Send(ctxT(t, time.Second), []byte("while a decision waits")); err != nil {
		t.Fatal(err)
	}
	go func() {
		n, err := urc.Recv(ctxT(t, 2*time.Second), buf)
		got <- result{n, err}
	}()
	var n int
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("a message on an established connection, while another connection ended during a decision: %v", r.err)
		}
		n = r.n
	case <-time.After(5 * time.Second):
		t.Fatal("Recv hangs past its context's deadline: a connection ended while another sender's TGT is being made")
	}
	if string(buf[:n]) != "while a decision waits" {
		t.Fatalf("received %q", buf[:n])
	}
	// A Recv with nothing to come ends at its deadline.
	start := time.Now()
	go func() {
		n, err := urc.Recv(ctxT(t, 200*time.Millisecond), buf)
		got <- result{n, err}
	}()
	select {
	case r := <-got:
		if r.err == nil {
			t.Fatalf("Recv with nothing sent: %d bytes", r.n)
		}
	case <-time.After(3 * time.Second):
		t.Fatalf("Recv hangs %v past its deadline of 200ms during a decision", time.Since(start))
	}
	released = true
	close(slow.release)
	if err := <-dialed; err != nil {
		t.Fatalf("the dial whose TGT was held back: %v", err)
	}
	if err := <-closed; err != nil {
		t.Fatalf("Close of the connection that ended: %v", err)
	}
	eventually(t, "the ended legs released (one left: u's)", func() (bool, string) {
		n := r.Stats().LocalCounts
		return n == 1, fmt.Sprintf("%d legs", n)
	})
}
