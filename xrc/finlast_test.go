package xrc

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// gatePolls takes send completions one at a time and, once armed, hands
// each over only when let has a token: the poller is slow. It records the
// kind and tag of every frame posted.
type gatePolls struct {
	wrapper
	armed atomic.Bool
	let   chan struct{}
	mu    sync.Mutex
	posts []postRec
}

type postRec struct {
	kind byte
	imm  uint32
}

func (k *gatePolls) PostSend(q kernel.QP, wrs []kernel.SendWR) error {
	k.mu.Lock()
	for _, wr := range wrs {
		if !k.armed.Load() {
			break
		}
		k.posts = append(k.posts, postRec{wr.Payload[0], wr.Imm})
	}
	k.mu.Unlock()
	return k.Kernel.PostSend(q, wrs)
}

func (k *gatePolls) PollSend(ctx context.Context, q kernel.QP, out []kernel.SendCompletion) (int, error) {
	n, err := k.Kernel.PollSend(ctx, q, out[:1])
	if err == nil && k.armed.Load() {
		select {
		case <-k.let:
		case <-ctx.Done():
		}
	}
	return n, err
}

// sent returns the kinds posted with tag imm since armed, in order.
func (k *gatePolls) sent(imm uint32) string {
	k.mu.Lock()
	defer k.mu.Unlock()
	var b []byte
	for _, p := range k.posts {
		if p.imm == imm {
			b = append(b, p.kind)
		}
	}
	return string(b)
}

// Nothing follows a connection's full FIN on its sending leg: its receiver
// lets the leg go on the FIN, and with the leg its handle on the TGT, which
// dies with its last holder. A credit frame that went after the FIN found
// no TGT (retries exhausted), and the sender's uplink recovered, moving
// every other leg on it, though nothing had failed (the chaos explorer's
// recoveries without a fault, at closes). Here the credit-return loop's
// first frame waits for its completion (a slow poller) while Close sends
// the FIN; the loop then had a second credit due and sent it.
func TestCloseSendsNoCreditAfterFIN(t *testing.T) {
	w := newWorld(t)
	gk := &gatePolls{let: make(chan struct{})}
	// a's receives pause below; a sends no keepalive in the test's time.
	long := func(c *Config) { c.IdleTimeout, c.Heartbeat = 20*time.Second, 5*time.Second }
	a := w.wrappedEndpoint("10.0.0.1", 7001, func(k kernel.Kernel) kernel.Kernel { gk.Kernel = k; return gk },
		long, func(c *Config) { c.RecvWindow = 2 }) // a credit frame per message taken
	b := w.endpoint("10.0.0.2", 7001, long)
	ca, cb := pair(t, a, b)
	for _, m := range []string{"one", "two"} {
		if err := cb.Send(ctxT(t, 5*time.Second), []byte(m)); err != nil {
			t.Fatal(err)
		}
	}
	a.mu.Lock()
	tag := ca.peerTag
	a.mu.Unlock()
	buf := make([]byte, 16)
	recv := func() {
		t.Helper()
		if _, err := ca.Recv(ctxT(t, 5*time.Second), buf); err != nil {
			t.Fatal(err)
		}
	}
	// Every completion so far taken (the dial's first frame's): the first
	// one held is the credit frame's.
	eventually(t, "earlier completions polled", func() (bool, string) {
		a.mu.Lock()
		defer a.mu.Unlock()
		n := len(ca.up.cur.waiters)
		return n == 0, fmt.Sprint(n, " waiting")
	})
	gk.armed.Store(true)
	recv() // the first credit frame goes; its completion is held
	eventually(t, "first credit frame posted", func() (bool, string) { return gk.sent(tag) == "C", gk.sent(tag) })
	recv() // a second credit is due
	// b's answering FIN stays in a's SRQ: the loop goes on as before it.
	a.p.PauseReceives()
	closed := make(chan struct{})
	go func() { defer close(closed); ca.Close() }()
	eventually(t, "FIN posted", func() (bool, string) { return gk.sent(tag) == "CF", gk.sent(tag) })
	eventually(t, "b lets the leg and the TGT go on the FIN", func() (bool, string) {
		s := w.f.Node("10.0.0.2").Stats()
		return s.TGTs == 0, fmt.Sprintf("%+v", s)
	})
	gk.let <- struct{}{} // the first credit frame's completion
	eventually(t, "credit loop done", func() (bool, string) {
		a.mu.Lock()
		defer a.mu.Unlock()
		return !ca.returning || len(gk.sent(tag)) > 2, gk.sent(tag)
	})
	gk.armed.Store(false)
	close(gk.let)
	<-closed
	a.p.ResumeReceives()
	eventually(t, "connections ended", func() (bool, string) {
		return a.Stats().Conns == 0 && b.Stats().Conns == 0, fmt.Sprintf("%+v / %+v", a.Stats(), b.Stats())
	})
	if got := gk.sent(tag); got != "CF" {
		t.Fatalf("frames on the leg: %q, want \"CF\" (nothing after the FIN); %+v", got, a.Stats())
	}
	if st := a.Stats(); st.Recoveries != 0 {
		t.Fatalf("%d recoveries, want 0: %+v", st.Recoveries, st)
	}
}
