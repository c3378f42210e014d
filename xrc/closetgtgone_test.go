package xrc

import (
	"io"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// A recovery under way at Endpoint.Close whose MOVE of a leg is refused
// TGT_GONE leaves that leg for the next round; Close must still start it,
// so that the leg's FIN reaches its receiver, which reads io.EOF as after
// any orderly Close. It started none (nothing was rebuilt while closing):
// the FIN went on the new INI, where the receiver, still on the old TGT,
// dropped it, and the old link's DREQ at release ended the connection with
// ErrPeerGone.
func TestCloseDuringRecoveryMovesLegRefusedTGTGone(t *testing.T) {
	w := newWorld(t)
	hs := func(c *Config) { longTimers(c); c.HandshakeTimeout = 5 * time.Second }
	s := w.endpoint("10.0.96.1", 7000, hs)
	countedTags(s.Endpoint)
	g := &stallMoves{release: make(chan struct{})}
	released := false
	defer func() {
		if !released {
			close(g.release)
		}
	}()
	var k2 *refusingTGT
	r1 := w.wrappedEndpoint("10.0.96.2", 7001, func(k kernel.Kernel) kernel.Kernel { g.Kernel = k; return g }, longTimers)
	r2 := w.wrappedEndpoint("10.0.96.2", 7002, refusingOnce(&k2), longTimers)
	r3 := w.endpoint("10.0.96.2", 7003, longTimers)
	pair(t, s, r1) // the lowest tag: its PHYS_REQ makes the new INI
	s2, c2 := pair(t, s, r2)
	s3, _ := pair(t, s, r3)
	ctx := ctxT(t, 10*time.Second)
	if err := s2.Send(ctx, []byte("last words")); err != nil {
		t.Fatal(err)
	}
	k2.armed.Store(true) // r2 refuses its leg's first MOVE: TGT_GONE
	r3.p.Kill()
	if err := sendErr(t, s3); err == nil {
		t.Fatal("a send to the killed r3 succeeded")
	}
	// The recovery waits for r1's PHYS MOVE; Close begins meanwhile.
	closed := make(chan struct{})
	go func() { s.Close(); close(closed) }()
	eventually(t, "Close under way", func() (bool, string) {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.closed, ""
	})
	close(g.release)
	released = true
	buf := make([]byte, 32)
	n, err := c2.Recv(ctx, buf)
	if err != nil || string(buf[:n]) != "last words" {
		t.Fatalf("r2: %q %v, want the message sent before Close", buf[:n], err)
	}
	if _, err := c2.Recv(ctx, buf); err != io.EOF {
		t.Fatalf("r2 after the message: %v, want io.EOF (r2 refused a MOVE: %v; sender %+v)", err, k2.refused.Load() > 0, s.Stats())
	}
	<-closed
}
