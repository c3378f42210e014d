package xrc

import (
	"io"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// finPosted, once armed, signals the first FIN its PostSend took, or, if
// refused is set, the first it refused.
type finPosted struct {
	wrapper
	armed   chan struct{}
	posted  chan struct{}
	refused chan struct{}
}

func (k *finPosted) PostSend(q kernel.QP, wrs []kernel.SendWR) error {
	// Read before the post: once it is posted, a data frame's completion
	// may free it (a kept frame) for another post to reuse, as -race saw.
	fin := len(wrs) == 1 && len(wrs[0].Payload) > 0 && wrs[0].Payload[0] == kindFIN
	err := k.Kernel.PostSend(q, wrs)
	if fin {
		select {
		case <-k.armed:
			ch := k.posted
			if err != nil {
				ch = k.refused
			}
			if ch != nil {
				select {
				case <-ch:
				default:
					close(ch)
				}
			}
		default:
		}
	}
	return err
}

// The FIN an acceptor posts on a reverse leg answered to a half that failed
// meanwhile (finAcceptedLocked) went without a waiter. Held in the INI's
// send queue (its receiver stopped with its one receive taken: the INI
// retries it for ever, as rnr_retry 7 does), it took the queue's one slot,
// and a post behind it saw no waiter but its own and took the full queue
// for one that nothing posted holds: a Send tried 16 times at once and
// failed the healthy INI, and the uplink recovered with no fault anywhere,
// 3 runs in 3. The FIN has a waiter now: the Send waits for room.
func TestFailedHalfFINHoldsItsSlotSend(t *testing.T) { failedHalfFIN(t, false) }

// The same for an internal frame behind that FIN (post): CloseWrite's FIN
// spent its 16 tries at once, and the healthy connection failed with
// errRetries, 3 runs in 3.
func TestFailedHalfFINHoldsItsSlotCloseWrite(t *testing.T) { failedHalfFIN(t, true) }

// failedHalfFIN sets the scene up again where the FIN found b's one send
// slot taken: by a keepalive of b's to q, whose completion b had not yet
// polled (every 25 ms; seen once in a CI run's loaded host suite). The
// FIN is then not posted, by design an ABORT goes instead
// (finAcceptedLocked), and there is no FIN to test behind.
func failedHalfFIN(t *testing.T, closeWrite bool) {
	for try := 1; !failedHalfFINOnce(t, closeWrite); try++ {
		if try == 3 {
			t.Fatal("setup: the FIN to the failed half found b's send queue full 3 times")
		}
		t.Logf("try %d: the FIN to the failed half found b's send queue full (a keepalive to q); again", try)
	}
}

// failedHalfFINOnce is failedHalfFIN's scene; it reports false where the
// FIN's post was refused.
func failedHalfFINOnce(t *testing.T, closeWrite bool) bool {
	w := newWorld(t)
	w.f.AddNode("10.0.102.1", memfabric.NodeConfig{SRQReceives: 1})
	w.f.AddNode("10.0.102.2", memfabric.NodeConfig{SRQReceives: 4, SendQueueDepth: 1})
	minute := func(c *Config) { c.IdleTimeout = time.Minute }
	a := w.endpoint("10.0.102.1", 7000, minute)
	q := w.endpoint("10.0.102.1", 7001, minute)
	rk := &holdReciprocal{held: make(chan struct{}), release: make(chan struct{})}
	fk := &finPosted{armed: make(chan struct{}), posted: make(chan struct{}), refused: make(chan struct{})}
	b := w.wrappedEndpoint("10.0.102.2", 7000, func(k kernel.Kernel) kernel.Kernel {
		rk.Kernel = k
		fk.Kernel = rk
		return fk
	})
	p := w.endpoint("10.0.102.2", 7001, longTimers) // the receiver that stops
	r := w.endpoint("10.0.102.3", 7000, longTimers) // takes a's one receive
	toP, _ := pair(t, a, p)
	cq, dq := pair(t, q, b) // b's uplink to node 1, where the FIN will wait
	ra, _ := pair(t, r, a)
	ctx := ctxT(t, 10*time.Second)
	stallBehind(t, ctx, toP, p)
	dialed, _ := halfFailedUnderReciprocal(t, a, b, rk)
	// a stops with its one receive taken: the FIN to it waits at b's INI.
	a.p.PauseReceives()
	t.Cleanup(a.p.ResumeReceives)
	if err := ra.Send(ctx, []byte("fill")); err != nil { // posted: in a's SRQ, or waiting for it
		t.Fatal(err)
	}
	close(fk.armed)
	close(rk.release)
	select {
	case <-fk.posted:
	case <-fk.refused:
		a.p.ResumeReceives()
		return false
	case <-time.After(5 * time.Second):
		t.Fatal("setup: the FIN to the failed half was never posted")
	}
	before := b.Stats()
	done := make(chan error, 1)
	go func() {
		if closeWrite {
			done <- dq.CloseWrite()
		} else {
			done <- dq.Send(ctx, []byte("behind the FIN"))
		}
	}()
	eventually(t, "b's post waits for room, or gives up", func() (bool, string) {
		s := b.Stats()
		return s.SendQueueFull > before.SendQueueFull || s.Recoveries > before.Recoveries || connErr(dq) != nil, ""
	})
	if s := b.Stats(); s.Recoveries != before.Recoveries || connErr(dq) != nil {
		t.Fatalf("behind a FIN that waits for its receiver: b's uplink recovered, or the connection failed (%v): %+v", connErr(dq), s)
	}
	a.p.ResumeReceives()
	p.p.ResumeReceives()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	n, err := cq.Recv(ctx, buf)
	if closeWrite {
		if err != io.EOF {
			t.Fatalf("q's recv after b's CloseWrite: %q, %v", buf[:n], err)
		}
	} else if err != nil || string(buf[:n]) != "behind the FIN" {
		t.Fatalf("q's recv: %q, %v", buf[:n], err)
	}
	if res := <-dialed; res.err == nil {
		res.c.Close()
	}
	for _, c := range []*Conn{toP, cq, dq, ra} {
		c.Close()
	}
	requireReleased(t, w, a, b, p, q, r)
	return true
}
