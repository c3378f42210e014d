package xrc

import (
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
