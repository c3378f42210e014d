package xrc

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// queued returns how many received messages c holds for Recv.
func queued(c *Conn) int {
	c.e.mu.Lock()
	defer c.e.mu.Unlock()
	return c.q.Len()
}

// credits returns what c may still send before the receiver's window is full.
func credits(c *Conn) int {
	c.e.mu.Lock()
	defer c.e.mu.Unlock()
	return int(c.sendWindow - (c.sent - c.acked))
}

func seqMsg(i int) []byte {
	b := make([]byte, 8+i%37)
	binary.BigEndian.PutUint64(b, uint64(i))
	for j := 8; j < len(b); j++ {
		b[j] = byte(i + j)
	}
	return b
}

func checkSeqMsg(b []byte, want int) error {
	if len(b) < 8 || binary.BigEndian.Uint64(b) != uint64(want) || len(b) != 8+want%37 {
		return fmt.Errorf("message %d: got %x", want, b)
	}
	for j := 8; j < len(b); j++ {
		if b[j] != byte(want+j) {
			return fmt.Errorf("message %d: byte %d corrupt", want, j)
		}
	}
	return nil
}

// sendSeq sends messages first..last-1; recvSeq receives them in order,
// pausing now and then when pause is set.
func sendSeq(ctx context.Context, c *Conn, first, last int) error {
	for i := first; i < last; i++ {
		if err := c.Send(ctx, seqMsg(i)); err != nil {
			return fmt.Errorf("send %d: %w", i, err)
		}
	}
	return nil
}

// streamAll streams messages first..last-1 on every pair, snd[i] to
// rcv[i], all at once, and returns the first error.
func streamAll(ctx context.Context, snd, rcv []*Conn, first, last int) error {
	var wg sync.WaitGroup
	errs := make(chan error, 2*len(snd))
	for i := range snd {
		wg.Add(2)
		go func() { defer wg.Done(); errs <- sendSeq(ctx, snd[i], first, last) }()
		go func() { defer wg.Done(); errs <- recvSeq(ctx, rcv[i], first, last, nil) }()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func recvSeq(ctx context.Context, c *Conn, first, last int, rng *rand.Rand) error {
	buf := make([]byte, 64)
	for i := first; i < last; i++ {
		if rng != nil && rng.IntN(50) == 0 {
			time.Sleep(time.Duration(rng.IntN(3)) * time.Millisecond)
		}
		n, err := c.Recv(ctx, buf)
		if err != nil {
			return fmt.Errorf("recv %d: %w", i, err)
		}
		if err := checkSeqMsg(buf[:n], i); err != nil {
			return err
		}
	}
	return nil
}

// TestFlowControlWindow checks, on every kind of leg (a PHYS forward leg
// with a reciprocal reverse leg on a first connection; a VIRT forward leg
// with the reverse leg in its ACCEPT on a second), each way: a sender sends
// exactly the receiver's window (not its own) and then waits; a Send that
// gives up while waiting posts nothing; reading returns credits, and a long
// stream then flows in order with the queue never above the window.
func TestFlowControlWindow(t *testing.T) {
	w := newWorld(t)
	a := w.endpoint("10.0.0.1", 7000, func(c *Config) { c.RecvWindow = 3 })
	b := w.endpoint("10.0.0.2", 7000, func(c *Config) { c.RecvWindow = 5 })
	for _, tc := range legKinds(t, a, b) {
		tc.window = 5
		if !tc.toB {
			tc.window = 3
		}
		t.Run(tc.name, func(t *testing.T) {
			if got := credits(tc.snd); got != tc.window {
				t.Fatalf("sender starts with %d credits, want the receiver's window %d", got, tc.window)
			}
			ctx := ctxT(t, 10*time.Second)
			if err := sendSeq(ctx, tc.snd, 0, tc.window); err != nil {
				t.Fatal(err)
			}
			// Send returns once the message is posted; the receive loop
			// queues it a moment later.
			eventually(t, "the window queued", func() (bool, string) {
				q := queued(tc.rcv)
				return q == tc.window, fmt.Sprintf("receiver holds %d messages, want %d", q, tc.window)
			})
			short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			err := tc.snd.Send(short, []byte("over the window"))
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("send past the window: %v, want a deadline error", err)
			}
			if got := credits(tc.snd); got != 0 {
				t.Fatalf("the abandoned send kept a credit: %d left", got)
			}
			const more = 300
			errc := make(chan error, 1)
			go func() { errc <- sendSeq(ctx, tc.snd, tc.window, tc.window+more) }()
			var high int
			buf := make([]byte, 64)
			for i := 0; i < tc.window+more; i++ {
				high = max(high, queued(tc.rcv))
				n, err := tc.rcv.Recv(ctx, buf)
				if err != nil {
					t.Fatalf("recv %d: %v", i, err)
				}
				if err := checkSeqMsg(buf[:n], i); err != nil {
					t.Fatal(err) // the abandoned message would show here
				}
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}
			if high > tc.window {
				t.Fatalf("receiver held %d messages, over its window %d", high, tc.window)
			}
		})
	}
	// Each receiver returns credits once its application has taken half
	// its window (at least one): at most one frame per that many messages.
	sa, sb := a.Stats(), b.Stats()
	t.Logf("credit frames: a %d (window 3, 606 messages), b %d (window 5, 610 messages)", sa.CreditFrames, sb.CreditFrames)
	if sa.Overruns+sb.Overruns != 0 {
		t.Fatalf("overruns %d/%d", sa.Overruns, sb.Overruns)
	}
	for _, x := range []struct {
		frames          uint64
		recvd, perFrame int
	}{{sa.CreditFrames, 2 * (3 + 300), 1}, {sb.CreditFrames, 2 * (5 + 300), 2}} {
		if x.frames == 0 || int(x.frames) > x.recvd/x.perFrame {
			t.Fatalf("%d credit frames for %d messages taken, one per %d", x.frames, x.recvd, x.perFrame)
		}
	}
}

// TestFlowControlBothWaysRandomized runs streams both ways at once on the
// smallest windows with random pauses; every message must arrive in order.
func TestFlowControlBothWaysRandomized(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			w := newWorld(t)
			wa, wb := 1+int(seed%2), 1+int(seed/2%2)
			a := w.endpoint("10.0.0.1", 7000, func(c *Config) { c.RecvWindow = wa })
			b := w.endpoint("10.0.0.2", 7000, func(c *Config) { c.RecvWindow = wb })
			ca, cb := pair(t, a, b)
			ctx := ctxT(t, 20*time.Second)
			const n = 400
			var wg sync.WaitGroup
			errs := make(chan error, 4)
			for i, f := range []func() error{
				func() error { return sendSeq(ctx, ca, 0, n) },
				func() error { return sendSeq(ctx, cb, 0, n) },
				func() error { return recvSeq(ctx, ca, 0, n, rand.New(rand.NewPCG(seed, 1))) },
				func() error { return recvSeq(ctx, cb, 0, n, rand.New(rand.NewPCG(seed, 2))) },
			} {
				wg.Go(func() {
					if err := f(); err != nil {
						errs <- fmt.Errorf("worker %d: %w", i, err)
					}
				})
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			if s := a.Stats(); s.Overruns != 0 || s.Dropped != 0 {
				t.Errorf("a: %+v", s)
			}
			if s := b.Stats(); s.Overruns != 0 || s.Dropped != 0 {
				t.Errorf("b: %+v", s)
			}
		})
	}
}

// TestFlowControlOverrun: a peer that sends past its credits (here, one
// whose sender was told a larger window) fails the connection with
// ErrProtocol once it holds twice the window, and the receiving leg's
// count on its TGT goes with it.
func TestFlowControlOverrun(t *testing.T) {
	w := newWorld(t)
	a := w.endpoint("10.0.0.1", 7000)
	b := w.endpoint("10.0.0.2", 7000, func(c *Config) { c.RecvWindow = 4 })
	ca, cb := pair(t, a, b)
	counts := b.Stats().LocalCounts
	a.mu.Lock()
	ca.sendWindow = 100 // the cheat
	a.mu.Unlock()
	ctx := ctxT(t, 5*time.Second)
	if err := sendSeq(ctx, ca, 0, 9); err != nil { // all nine reach b's SRQ
		t.Fatal(err)
	}
	eventually(t, "overrun", func() (bool, string) {
		s := b.Stats()
		return s.Overruns == 1 && s.LocalCounts == counts-1, fmt.Sprintf("%+v", s)
	})
	// What was queued within the limit is still there; then the error.
	if err := recvSeq(ctx, cb, 0, 8, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := cb.Recv(ctx, make([]byte, 64)); !errors.Is(err, ErrProtocol) {
		t.Fatalf("recv after the overrun: %v, want ErrProtocol", err)
	}
}

// TestFlowControlHostileCreditFrames: malformed credit frames are dropped;
// a count ahead of what was sent gives no more than was sent; a count
// behind (a late frame) changes nothing.
func TestFlowControlHostileCreditFrames(t *testing.T) {
	w := newWorld(t)
	a := w.endpoint("10.0.0.1", 7000, func(c *Config) { c.RecvWindow = 2 })
	b := w.endpoint("10.0.0.2", 7000, func(c *Config) { c.RecvWindow = 2 })
	ca, cb := pair(t, a, b)
	ctx := ctxT(t, 5*time.Second)
	if err := sendSeq(ctx, ca, 0, 2); err != nil {
		t.Fatal(err)
	}
	if got := credits(ca); got != 0 {
		t.Fatalf("credits %d after filling the window", got)
	}
	// b's engine speaks for itself: frames on its sending leg, as a
	// hostile b would send them.
	frame := func(body []byte) {
		t.Helper()
		if err := cb.sendFrame(ctx, kindCredit, body); err != nil {
			t.Fatal(err)
		}
	}
	dropped := a.Stats().Dropped
	frame([]byte{0, 0, 1})          // short
	frame([]byte{0, 0, 0, 1, 0xFF}) // long
	eventually(t, "malformed frames dropped", func() (bool, string) {
		s := a.Stats()
		return s.Dropped == dropped+2, fmt.Sprintf("dropped %d", s.Dropped)
	})
	if got := credits(ca); got != 0 {
		t.Fatalf("malformed frames gave %d credits", got)
	}
	frame([]byte{0, 1, 0, 0}) // 65536 taken: far more than the 2 sent
	eventually(t, "capped", func() (bool, string) {
		n := credits(ca)
		return n == 2, fmt.Sprint(n, " credits")
	})
	if err := sendSeq(ctx, ca, 2, 4); err != nil {
		t.Fatal(err)
	}
	frame([]byte{0, 0, 0, 1}) // behind: late
	time.Sleep(20 * time.Millisecond)
	if got := credits(ca); got != 0 {
		t.Fatalf("a late frame gave %d credits", got)
	}
	// b's messages are all still there, uncorrupted.
	if err := recvSeq(ctx, cb, 0, 4, nil); err != nil {
		t.Fatal(err)
	}
}

// FuzzCreditFrame: whatever a peer puts in a credit frame, the count of our
// messages it says were taken never goes back and never passes what we sent;
// an honest count (from acked up to sent) is taken as it is, one behind
// acked changes nothing, one ahead of sent is capped at it.
func FuzzCreditFrame(f *testing.F) {
	f.Add([]byte{0, 0, 0, 3}, uint32(1), uint32(2))
	f.Add([]byte{0xFF, 0xFF, 0xFF, 0xFF}, uint32(0), uint32(64))
	f.Add([]byte{0, 0, 1}, uint32(5), uint32(5))
	f.Add([]byte{0x80, 0, 0, 0}, uint32(0xFFFFFFF0), uint32(0x10))
	f.Add([]byte{0, 0, 0, 9}, uint32(1), uint32(2)) // ahead of sent: capped
	f.Fuzz(func(t *testing.T, body []byte, acked, ahead uint32) {
		sent := acked + ahead%(1<<16) // at most a window (16 bits) outstanding
		got, ok := creditAck(body, acked, sent)
		if ok != (len(body) == creditLen) {
			t.Fatalf("ok=%v for a %d-byte body", ok, len(body))
		}
		if got-acked > sent-acked {
			t.Fatalf("acked %d -> %d with %d sent", acked, got, sent)
		}
		if !ok && got != acked {
			t.Fatal("a malformed frame moved acked")
		}
		if ok {
			v := binary.BigEndian.Uint32(body)
			if v-acked <= sent-acked && got != v {
				t.Fatalf("count %d (acked %d, sent %d) taken as %d", v, acked, sent, got)
			}
			// docs/xrc-protocol.md: a count at or behind acked changes
			// nothing; one ahead of sent is capped at it.
			if d := v - acked; int32(d) <= 0 && got != acked || int32(d) > 0 && d > sent-acked && got != sent {
				t.Fatalf("count %d (acked %d, sent %d) taken as %d", v, acked, sent, got)
			}
		}
	})
}

// TestFlowControlReceiverKilled: a sender waiting for credits from a
// receiver that is killed (kill -9) does not hang: Send fails with
// ErrPeerGone, and nothing of the connection is left on either side.
func TestFlowControlReceiverKilled(t *testing.T) {
	w := newWorld(t)
	s := w.endpoint("10.0.0.1", 7000)
	r := w.endpoint("10.0.0.2", 7000, func(c *Config) { c.RecvWindow = 2 })
	cs, _ := pair(t, s, r)
	ctx := ctxT(t, 10*time.Second)
	if err := sendSeq(ctx, cs, 0, 2); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- cs.Send(ctx, []byte("waits for a credit")) }()
	eventually(t, "the sender waiting", func() (bool, string) {
		return credits(cs) == 0, fmt.Sprint(credits(cs), " credits")
	})
	r.p.Kill()
	if err := <-errc; !errors.Is(err, ErrPeerGone) {
		t.Fatalf("send waiting on a killed receiver: %v, want ErrPeerGone", err)
	}
	eventually(t, "the sender's state released", func() (bool, string) {
		st := s.Stats()
		return st.Conns == 0 && st.LocalCounts == 0, fmt.Sprintf("%+v", st)
	})
}

// sendGate holds back send completions while hold is set.
type sendGate struct {
	kernel.Kernel
	mu   sync.Mutex
	hold chan struct{} // nil: pass completions at once
}

func (g *sendGate) PollSend(ctx context.Context, q kernel.QP, out []kernel.SendCompletion) (int, error) {
	n, err := g.Kernel.PollSend(ctx, q, out)
	g.mu.Lock()
	h := g.hold
	g.mu.Unlock()
	if h != nil {
		select {
		case <-h:
		case <-ctx.Done():
		}
	}
	return n, err
}

func (g *sendGate) wrap(k kernel.Kernel) kernel.Kernel { g.Kernel = k; return g }

func (g *sendGate) set(hold chan struct{}) {
	g.mu.Lock()
	g.hold = hold
	g.mu.Unlock()
}

// TestSendReturnsOncePosted: Send returns once its message is posted, not
// when it completes, so one goroutine streams. With every send completion
// held back, the sender goes on (the receiver returning credits) until a
// replay span of messages waits for completions; the next Send waits, and
// given up, sends nothing. Once the completions come, the stream goes on in
// order and the connection keeps nothing.
func TestSendReturnsOncePosted(t *testing.T) {
	w := newWorld(t)
	r := w.endpoint("10.0.0.2", 7000, func(c *Config) { c.RecvWindow = 4 })
	gate := &sendGate{}
	se := w.wrappedEndpoint("10.0.0.1", 7000, gate.wrap, longTimers)
	cs, cr := pair(t, se, r)
	ctx := ctxT(t, 10*time.Second)
	kept := func() int {
		se.mu.Lock()
		defer se.mu.Unlock()
		return cs.out.Len()
	}

	release := make(chan struct{})
	gate.set(release)
	span := int(replaySpan(4))
	recvd := make(chan error, 1)
	go func() { recvd <- recvSeq(ctx, cr, 0, span, nil) }()
	if err := sendSeq(ctx, cs, 0, span); err != nil {
		t.Fatal(err)
	}
	if err := <-recvd; err != nil {
		t.Fatal(err)
	}
	if n := kept(); n != span {
		t.Fatalf("%d messages kept for their completions, want %d", n, span)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	err := cs.Send(short, []byte("a span ahead"))
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("send a replay span ahead of the oldest completion: %v, want a deadline error", err)
	}
	gate.set(nil)
	close(release)

	const n = 300
	errc := make(chan error, 1)
	go func() { errc <- sendSeq(ctx, cs, span, n) }()
	if err := recvSeq(ctx, cr, span, n, nil); err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	eventually(t, "every completion taken", func() (bool, string) {
		return kept() == 0, fmt.Sprintf("%d kept", kept())
	})
	if s := r.Stats(); s.Overruns != 0 || s.Duplicates != 0 {
		t.Fatalf("receiver: %+v", s)
	}
}

// legCase is one leg of the connections legKinds makes.
type legCase struct {
	name     string
	snd, rcv *Conn
	toB      bool // a sends, b receives
	window   int  // for the test's own use
}

// legKinds dials twice from a to b and returns the four kinds of leg the
// two connections have: a PHYS forward leg with a reciprocal reverse leg,
// then a VIRT forward leg whose reverse leg rode its ACCEPT.
func legKinds(t *testing.T, a, b *proc) []legCase {
	t.Helper()
	first, firstB := pair(t, a, b)
	second, secondB := pair(t, a, b)
	if s := a.Stats(); s.OneExchange != 1 {
		t.Fatalf("the second connection should take one exchange: %+v", s)
	}
	return []legCase{
		{name: "PHYS forward leg", snd: first, rcv: firstB, toB: true},
		{name: "reciprocal reverse leg", snd: firstB, rcv: first},
		{name: "VIRT forward leg", snd: second, rcv: secondB, toB: true},
		{name: "one-exchange reverse leg", snd: secondB, rcv: second},
	}
}

// The peer's window (its ACCEPT's credits, up to 65535) bounds what we keep
// for resends but does not size it: the ring is grown as messages wait for
// their completions. Made at the bound, a peer announcing 65535 cost every
// connection to it 7 MiB at its first Send.
func TestPeerWindowDoesNotSizeOurMemory(t *testing.T) {
	w := newWorld(t)
	s := w.endpoint("10.0.0.1", 7000)
	r := w.endpoint("10.0.0.2", 7000, func(c *Config) { c.RecvWindow = 65535 })
	cs, cr := pair(t, s, r)
	roundTrip(t, cs, cr, []byte("x"))
	s.mu.Lock()
	kept, window := cs.out.Cap(), cs.sendWindow
	s.mu.Unlock()
	if window != 65535 || kept > 64 {
		t.Fatalf("window %d: room for %d frames after one message, want the window 65535 and room for at most 64", window, kept)
	}
	// Many in flight: the ring grows, and every message arrives in order.
	ctx := ctxT(t, 20*time.Second)
	if err := streamAll(ctx, []*Conn{cs}, []*Conn{cr}, 1, 3000); err != nil {
		t.Fatal(err)
	}
}
