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

// heldKeepalive holds the keepalive posts of the leg whose receiver tag is
// tag inside PostSend until released, and records the kinds posted on it.
type heldKeepalive struct {
	wrapper
	tag     atomic.Uint32
	armed   atomic.Bool
	entered chan struct{}
	release chan struct{}
	mu      sync.Mutex
	kinds   []byte
}

func (k *heldKeepalive) PostSend(q kernel.QP, wrs []kernel.SendWR) error {
	if k.armed.Load() && len(wrs) == 1 && wrs[0].Imm == k.tag.Load() && len(wrs[0].Payload) > 0 {
		kind := wrs[0].Payload[0]
		if kind == kindHeartbeat {
			k.entered <- struct{}{}
			<-k.release
		}
		k.mu.Lock()
		k.kinds = append(k.kinds, kind)
		k.mu.Unlock()
	}
	return k.wrapper.PostSend(q, wrs)
}

func (k *heldKeepalive) posted() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return string(k.kinds)
}

// A keepalive already past post's check when Close sends our FIN goes
// before the FIN, not after it: the FIN waits for it. It could be posted
// after the FIN, to a receiver that let the leg go at the FIN and perhaps
// its TGT with it, failing the INI (a review of 1af81bc, which closed the
// gap for frames that came to post after the FIN).
func TestCloseFINWaitsForKeepaliveUnderWay(t *testing.T) {
	w := newWorld(t)
	k := &heldKeepalive{entered: make(chan struct{}), release: make(chan struct{})}
	s := w.wrappedEndpoint("10.0.194.1", 7000, func(kk kernel.Kernel) kernel.Kernel { k.wrapper = wrapper{kk}; return k }, longTimers)
	r := w.endpoint("10.0.194.2", 7000, longTimers)
	x, _ := pair(t, s, r)
	s.mu.Lock()
	k.tag.Store(x.peerTag)
	s.mu.Unlock()
	k.armed.Store(true)
	go x.post(kindHeartbeat, nil, nil)
	<-k.entered // past post's check, inside PostSend
	closed := make(chan error, 1)
	go func() { closed <- x.Close() }()
	deadline := time.Now().Add(300 * time.Millisecond)
	for time.Now().Before(deadline) && k.posted() == "" {
		time.Sleep(time.Millisecond)
	}
	if got := k.posted(); got != "" {
		close(k.release)
		t.Fatalf("posted %q while a keepalive was still under way: the FIN went before it", got)
	}
	close(k.release)
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if got := k.posted(); got != "HF" {
		t.Fatalf("frames on the leg: %q, want %q (the keepalive, then the FIN)", got, "HF")
	}
	if st := s.Stats(); st.Recoveries != 0 {
		t.Fatalf("%d recoveries", st.Recoveries)
	}
}
