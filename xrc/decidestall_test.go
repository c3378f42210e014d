package xrc

import (
	"fmt"
	"io"
	"sync"
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
	finish := holdDecision(t, slow, third, r)
	time.Sleep(2 * testIdle / 4) // the janitor's linger pass comes (lingerEvery)
	if err := sc.Send(ctxT(t, time.Second), []byte("while a decision waits")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, err := recvWithin(t, rc, 2*time.Second, buf, "a message on an established connection, while another sender's TGT is being made")
	if err != nil {
		t.Fatalf("a message on an established connection, while another sender's TGT is being made: %v", err)
	}
	if string(buf[:n]) != "while a decision waits" {
		t.Fatalf("received %q", buf[:n])
	}
	if err := finish(); err != nil {
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
	finish := holdDecision(t, slow, third, r)
	// The peer's FIN ends src's receiving leg: its release comes during
	// the decision.
	closed := make(chan error, 1)
	go func() { closed <- sc.Close() }()
	buf := make([]byte, 64)
	if n, err := recvWithin(t, src, 2*time.Second, buf, "Recv on the connection whose peer closed"); err != io.EOF {
		t.Fatalf("the closed connection's Recv: %d, %v, want io.EOF", n, err)
	}
	time.Sleep(50 * time.Millisecond) // its FIN consumed, its leg released
	if err := uc.Send(ctxT(t, time.Second), []byte("while a decision waits")); err != nil {
		t.Fatal(err)
	}
	n, err := recvWithin(t, urc, 2*time.Second, buf, "a message on an established connection, while another connection ended during a decision")
	if err != nil {
		t.Fatalf("a message on an established connection, while another connection ended during a decision: %v", err)
	}
	if string(buf[:n]) != "while a decision waits" {
		t.Fatalf("received %q", buf[:n])
	}
	// A Recv with nothing to come ends at its deadline.
	if n, err := recvWithin(t, urc, 200*time.Millisecond, buf, "Recv with nothing sent, a deadline of 200ms"); err == nil {
		t.Fatalf("Recv with nothing sent: %d bytes", n)
	}
	if err := finish(); err != nil {
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

// holdDecision arms slow and has third dial r: r's decision then waits in
// CreateTGT, holding the acceptor's lock, until finish lets it go; finish
// returns the dial's error. The test's end lets it go too.
func holdDecision(t *testing.T, slow *slowTGT, third, r *proc) (finish func() error) {
	t.Helper()
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
	var once sync.Once
	release := func() { once.Do(func() { close(slow.release) }) }
	t.Cleanup(release)
	return func() error { release(); return <-dialed }
}

// recvWithin is c.Recv with a deadline of d, which must return within 5 s:
// a Recv that waits for the endpoint's lock before it looks at its context
// hangs while the lock's holder waits for a decision.
func recvWithin(t *testing.T, c *Conn, d time.Duration, buf []byte, what string) (int, error) {
	t.Helper()
	type result struct {
		n   int
		err error
	}
	got := make(chan result, 1)
	ctx := ctxT(t, d)
	go func() {
		n, err := c.Recv(ctx, buf)
		got <- result{n, err}
	}()
	select {
	case r := <-got:
		return r.n, r.err
	case <-time.After(d + 5*time.Second):
		t.Fatalf("%s: Recv hangs past its deadline of %v while another sender's TGT is being made", what, d)
		return 0, nil
	}
}
