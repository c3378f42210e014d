package xrc

import (
	"context"
	"errors"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// finGap holds the receive loop's polls (holdRecv) and, once armed, at the
// first Disconnect, which the janitor's failure of the first of two idle
// connections calls under the endpoint's lock (dropSendLocked tears down
// the connection's uplink), takes what waits in the SRQ, both peers' half
// FINs, as the receive loop takes it (deliver's locked part): the janitor's
// pass goes on with the second connection after it. A connection already
// failed has let its leg go, and the loop would drop its frames (deliver
// finds no connection for the tag); the other's FIN is taken before the
// janitor fails it. After that, a keepalive post says the janitor's pass
// is over: only the janitor posts them, after the connections it failed.
type finGap struct {
	*holdRecv
	e       *Endpoint
	armed   atomic.Bool
	target  *Conn         // the connection whose FIN was taken while it was up
	notHeld string        // set if the Disconnect ran without the endpoint's lock
	taken   chan struct{} // closed once the FINs are taken
	beat    chan struct{} // closed at a keepalive's post after that
	beaten  atomic.Bool
}

func (k *finGap) Disconnect(id kernel.ID) error {
	err := k.holdRecv.Kernel.Disconnect(id)
	if !k.armed.CompareAndSwap(true, false) {
		return err
	}
	e := k.e
	if e.mu.TryLock() {
		e.mu.Unlock()
		k.notHeld = "the uplink's Disconnect ran without the endpoint's lock"
		close(k.taken)
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wcs [32]kernel.RecvCompletion
	for fins := 0; fins < 2 && ctx.Err() == nil; {
		n, _ := k.holdRecv.Kernel.PollRecv(ctx, e.srq, wcs[:])
		for _, wc := range wcs[:n] {
			if len(wc.Payload) > 0 && wc.Payload[0] == kindFIN {
				fins++
			}
			c := e.recv[wc.Imm]
			if c == nil || c.recvTag != wc.Imm || c.failed() || !e.consumeLocked(c, c.recvLeg, wc.Payload) {
				kernel.FreePayload(wc.Payload)
			}
			if c != nil && !c.failed() && c.finRcvd {
				k.target = c
			}
		}
	}
	close(k.taken)
	return err
}

func (k *finGap) PostSend(q kernel.QP, wrs []kernel.SendWR) error {
	if len(wrs) == 1 && len(wrs[0].Payload) == 1 && wrs[0].Payload[0] == kindHeartbeat {
		select {
		case <-k.taken:
			if k.beaten.CompareAndSwap(false, true) {
				close(k.beat)
			}
		default:
		}
	}
	return k.holdRecv.Kernel.PostSend(q, wrs)
}

// The janitor took its idle verdict on a connection under the endpoint's
// lock, let go of it, and failed the connection after: a frame taken in
// between, the peer's half FIN here (its CloseWrite), did not count.
// Recv had read io.EOF, the peer's orderly end of its data, and still Err
// said the peer was gone (errIdle, ErrPeerGone), Send failed so, and the
// reply the half-closed peer waited for never went; taken just before the
// janitor's look, the FIN is a sign of life and the connection goes on
// (it fails only after another idle timeout of silence). Two connections
// go idle in one look: the failure of the first, whichever the map gives
// first, takes both FINs (finGap) before the janitor goes on to the second.
// The old code fails the second connection every run.
func TestIdleVerdictTakesFINBeforeIt(t *testing.T) {
	w := newWorld(t)
	fk := &finGap{holdRecv: &holdRecv{held: make(chan struct{}, 1), release: make(chan struct{})},
		taken: make(chan struct{}), beat: make(chan struct{})}
	s := w.wrappedEndpoint("10.0.84.1", 7000, func(k kernel.Kernel) kernel.Kernel { fk.Kernel = k; return fk },
		func(c *Config) { c.IdleTimeout = 10 * time.Second })
	fk.e = s.Endpoint
	silent := func(c *Config) { c.Heartbeat = time.Hour } // no keepalives
	a := w.endpoint("10.0.84.2", 7000, silent)
	b := w.endpoint("10.0.84.3", 7000, silent)
	sa, ac := pair(t, s, a)
	sb, bc := pair(t, s, b)
	for _, p := range []struct{ c, d *Conn }{{sa, ac}, {sb, bc}} {
		roundTrip(t, p.c, p.d, []byte("up"))
		roundTrip(t, p.d, p.c, []byte("and back"))
	}
	// A dial's idle clock restarts when its first frame's completion is
	// polled (firstDue), which the round trips do not wait for: set back
	// before that, it went forward again, the janitor's look found one
	// connection idle, not two, and the test passed against the old
	// janitor (5 runs in 100).
	eventually(t, "the dials' first frames completed", func() (bool, string) {
		s.mu.Lock()
		defer s.mu.Unlock()
		return !sa.firstDue && !sb.firstDue, ""
	})

	// The receive loop held: the peers' FINs wait in the SRQ.
	fk.holdRecv.armed.Store(true)
	s.kickPoll()
	select {
	case <-fk.held:
	case <-time.After(5 * time.Second):
		t.Fatal("the receive loop's poll was not held")
	}
	for _, c := range []*Conn{ac, bc} {
		if err := c.CloseWrite(); err != nil {
			t.Fatal(err)
		}
	}
	fk.armed.Store(true)
	s.mu.Lock()
	long := time.Now().Add(-2 * max(s.cfg.IdleTimeout, s.cfg.HandshakeTimeout)) // both silent long, for the same look
	sa.lastSeen, sb.lastSeen = long, long
	s.mu.Unlock()

	select {
	case <-fk.taken:
	case <-time.After(10 * time.Second):
		t.Fatal("the janitor failed no connection")
	}
	close(fk.holdRecv.release)
	if fk.notHeld != "" {
		t.Fatal(fk.notHeld)
	}
	c := fk.target
	if c == nil {
		t.Fatal("no FIN was taken on a connection still up")
	}
	first, peer := sa, bc
	if c == sa {
		first, peer = sb, ac
	}
	select {
	case <-c.done:
		_, rerr := c.Recv(ctxT(t, time.Second), make([]byte, 8))
		t.Fatalf("the connection whose half FIN was taken after the janitor's look and before its failure "+
			"failed by that look's verdict: Err() = %v, Recv = %v", c.Err(), rerr)
	case <-fk.beat: // the janitor's pass is over
	case <-time.After(10 * time.Second):
		t.Fatal("no keepalive after the FINs were taken")
	}
	if err := c.Err(); err != nil {
		t.Errorf("Err() after the peer's half FIN: %v, want nil", err)
	}
	ctx := ctxT(t, 5*time.Second)
	if _, err := c.Recv(ctx, make([]byte, 8)); !errors.Is(err, io.EOF) {
		t.Errorf("Recv after the peer's half FIN: %v, want io.EOF", err)
	}
	if err := c.Send(ctx, []byte("reply")); err != nil {
		t.Fatalf("Send to the half-closed peer: %v", err)
	}
	buf := make([]byte, 8)
	if n, err := peer.Recv(ctx, buf); err != nil || string(buf[:n]) != "reply" {
		t.Fatalf("the half-closed peer's Recv: %q, %v; want the reply", buf[:n], err)
	}
	c.Close()
	if _, err := peer.Recv(ctx, buf); !errors.Is(err, io.EOF) {
		t.Errorf("the half-closed peer's Recv after our Close: %v, want io.EOF", err)
	}
	// The first failed before its FIN was taken: the janitor's verdict.
	if err := first.Err(); !errors.Is(err, errIdle) {
		t.Errorf("the connection failed first: Err() = %v, want errIdle", err)
	}
}
