package xrc

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/goxrc/goxrc/xrc/memfabric"
)

// CloseWrite waits for its FIN, within HandshakeTimeout of a context made
// from the endpoint's. When the endpoint closes under that wait, CloseWrite
// is an operation on a closed Endpoint and Conn, which return ErrClosed
// (ErrClosed's doc, and Send's behaviour in the same place), in an *OpError
// of Op "close write" (OpError's list; CloseWrite's own checks use it). It
// returned the bare context.Canceled of that context while the uplink
// recovered (the FIN waits for it to come up), and an *OpError of Op
// "send" where the FIN had been posted and never completed (the receiver
// stalled: RNR).
func TestCloseWriteOnClosingEndpointIsErrClosed(t *testing.T) {
	want := func(t *testing.T, err error) {
		t.Helper()
		var oe *OpError
		if !errors.Is(err, ErrClosed) || !errors.As(err, &oe) || oe.Op != "close write" {
			t.Fatalf("CloseWrite as its endpoint closed: %v (%T), want an *OpError \"close write\" matching ErrClosed", err, err)
		}
	}
	t.Run("uplink recovering", func(t *testing.T) {
		w := newWorld(t)
		a, b := w.endpoint("10.0.121.1", 7000, longTimers), w.endpoint("10.0.121.2", 7000, longTimers)
		c, _ := pair(t, a, b)
		// A power cut at the receiver: the next send fails the INI, and
		// the recovery's request goes unanswered for HandshakeTimeout.
		w.f.Node("10.0.121.2").PowerOff()
		if err := c.Send(ctxT(t, 5*time.Second), []byte("x")); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the uplink recovering", func() (bool, string) {
			a.mu.Lock()
			defer a.mu.Unlock()
			return c.up.state == upRecovering, c.up.state.String()
		})
		res := make(chan error, 1)
		go func() { res <- c.CloseWrite() }()
		eventually(t, "CloseWrite under way", func() (bool, string) {
			a.mu.Lock()
			defer a.mu.Unlock()
			return c.writeClosed, ""
		})
		time.Sleep(20 * time.Millisecond) // it waits for the uplink by now
		a.Close()
		select {
		case err := <-res:
			want(t, err)
		case <-time.After(5 * time.Second):
			t.Fatal("CloseWrite still waits after its endpoint closed")
		}
	})
	// A FIN posted behind a stalled receiver is no wait of CloseWrite's:
	// it returns nil once the FIN is posted, as a Send does
	// (TestCloseWriteReturnsOncePostedBehindAStalledReceiver); the
	// endpoint's Close then ends the engine's wait for its completion.
	t.Run("FIN posted, receiver stalled", func(t *testing.T) {
		w := newWorld(t)
		w.f.AddNode("10.0.121.4", memfabric.NodeConfig{SRQReceives: 1})
		a, b := w.endpoint("10.0.121.3", 7000, longTimers), w.endpoint("10.0.121.4", 7000, longTimers)
		c, _ := pair(t, a, b)
		b.p.PauseReceives()
		t.Cleanup(b.p.ResumeReceives)
		// Takes the one receive of b's SRQ: every later send waits (RNR).
		if err := c.Send(ctxT(t, 5*time.Second), []byte("x")); err != nil {
			t.Fatal(err)
		}
		res := make(chan error, 1)
		go func() { res <- c.CloseWrite() }()
		eventually(t, "the half FIN posted", func() (bool, string) {
			a.mu.Lock()
			defer a.mu.Unlock()
			n := len(c.up.cur.waiters)
			return c.writeClosed && n == 1, fmt.Sprintf("%d frames waiting", n)
		})
		select {
		case err := <-res:
			if err != nil {
				t.Fatalf("CloseWrite with its FIN posted: %v, want nil", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("CloseWrite waits for the stalled receiver")
		}
		a.Close()
		if err := c.CloseWrite(); !errors.Is(err, ErrClosed) {
			t.Fatalf("CloseWrite after its endpoint closed: %v, want ErrClosed", err)
		}
	})
}
