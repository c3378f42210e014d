package xrc

import (
	"io"
	"testing"
	"time"

	"github.com/goxrc/goxrc/xrc/memfabric"
)

// Close's FIN is the last message on our leg, sent and completed
// (xrc-protocol.md; cm's Close waits, bounded, for a receive buffer at the
// peer to take its end of stream): behind a receiver that takes nothing in
// (a stopped process, its SRQ out of receives) Close waits for the FIN's
// completion, not only for its post as CloseWrite does, and returns once
// the receiver takes it, within Config.HandshakeTimeout. Close's doc said
// it waited "for its FIN's post" (and, where the receiver's endpoint was
// gone, for the verdict): it waits up to the whole HandshakeTimeout (30 s
// by default) for a stalled peer.
func TestCloseWaitsForItsFINBehindAStalledReceiver(t *testing.T) {
	w := newWorld(t)
	w.f.AddNode("10.0.97.2", memfabric.NodeConfig{SRQReceives: 1})
	a := w.endpoint("10.0.97.1", 7000, longTimers, func(c *Config) { c.HandshakeTimeout = 5 * time.Second })
	b := w.endpoint("10.0.97.2", 7000, longTimers)
	c, d := pair(t, a, b)
	b.p.PauseReceives()
	ctx := ctxT(t, 10*time.Second)
	if err := c.Send(ctx, []byte("x")); err != nil { // takes the SRQ's one receive
		t.Fatal(err)
	}
	closed := make(chan time.Duration, 1)
	start := time.Now()
	go func() {
		c.Close()
		closed <- time.Since(start)
	}()
	select {
	case el := <-closed:
		t.Fatalf("Close returned after %v with its FIN waiting behind the stalled receiver", el)
	case <-time.After(500 * time.Millisecond):
	}
	b.p.ResumeReceives()
	select {
	case el := <-closed:
		if el > 4*time.Second {
			t.Fatalf("Close took %v: not ended by the FIN's completion", el)
		}
	case <-time.After(4 * time.Second):
		t.Fatal("Close did not return once the receiver took its FIN")
	}
	buf := make([]byte, 8)
	if n, err := d.Recv(ctx, buf); err != nil || string(buf[:n]) != "x" {
		t.Fatalf("Recv: %q, %v", buf[:n], err)
	}
	if _, err := d.Recv(ctx, buf); err != io.EOF {
		t.Fatalf("after the message: %v, want io.EOF", err)
	}
	if c.Err() != nil {
		t.Fatalf("Err after Close: %v", c.Err())
	}
	d.Close()
}
