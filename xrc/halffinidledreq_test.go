package xrc

import (
	"errors"
	"io"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// As TestHalfFINThenDREQIsNoFailure, but with the idle verdict falling due
// before the DREQ's: the peer half-closed, said nothing more for most of
// our idle timeout (its keepalives are an IdleTimeout-Heartbeat apart at
// worst where IdleTimeout is 2*Heartbeat, the least Config allows), and
// died. Its INI's DREQ reached us (goneAt), but the janitor's look found
// the idle timeout passed before the DREQ's grace did, and failed the
// connection with errIdle, the label of a silent peer: Err said
// ErrPeerGone where the DREQ's verdict, one look later, says nothing.
// d79cf47 made the peer's death no failure only where the DREQ's
// verdict comes first.
func TestHalfFINThenDREQIsNoFailureIdleFirst(t *testing.T) {
	w := newWorld(t)
	k := &slowSendFailure{release: make(chan struct{})}
	t.Cleanup(func() { close(k.release) })
	r := w.wrappedEndpoint("10.0.69.1", 7000, func(kk kernel.Kernel) kernel.Kernel { k.Kernel = kk; return k },
		func(c *Config) { c.Heartbeat, c.IdleTimeout = time.Second, 4*time.Second })
	s := w.endpoint("10.0.69.2", 7000, longTimers) // no keepalives of its own
	sc, rc := pair(t, s, r)
	roundTrip(t, rc, sc, []byte("up"))

	ctx := ctxT(t, 20*time.Second)
	if err := sc.Send(ctx, []byte("last words")); err != nil {
		t.Fatal(err)
	}
	if err := sc.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "r took s's half FIN", func() (bool, string) {
		r.mu.Lock()
		defer r.mu.Unlock()
		return rc.finRcvd, ""
	})
	r.mu.Lock()
	seen := rc.lastSeen
	r.mu.Unlock()
	time.Sleep(time.Until(seen.Add(3500 * time.Millisecond))) // half a heartbeat short of r's idle timeout
	k.armed.Store(true)
	s.p.Kill() // its INI's CM id sends the DREQ to r's link
	eventually(t, "the connection ended", func() (bool, string) {
		r.mu.Lock()
		defer r.mu.Unlock()
		return rc.err != nil, ""
	})
	r.mu.Lock()
	sendGone, goneAt := rc.sendGone, rc.goneAt
	r.mu.Unlock()
	if sendGone != nil || goneAt.IsZero() {
		t.Fatalf("setup: sendGone %v, goneAt %v: want the DREQ seen and no keepalive failure", sendGone, goneAt)
	}
	if err := rc.Err(); err != nil {
		t.Errorf("Err() after the peer's half FIN and its death (its INI's DREQ), the idle timeout first: %v, want nil", err)
	}
	buf := make([]byte, 32)
	n, err := rc.Recv(ctx, buf)
	if err != nil || string(buf[:n]) != "last words" {
		t.Fatalf("Recv: %q, %v; want the last words", buf[:n], err)
	}
	if _, err := rc.Recv(ctx, buf); !errors.Is(err, io.EOF) {
		t.Errorf("Recv after the last words: %v, want io.EOF", err)
	}
}
