package xrc

import (
	"io"
	"testing"
	"time"

	"github.com/goxrc/goxrc/xrc/memfabric"
)

// CloseWrite returns once its FIN is posted, as Send does: a receiver that
// takes nothing in (a stopped process, its SRQ out of receives) holds the
// FIN's completion back, and CloseWrite waited for it for the whole
// HandshakeTimeout, then failed with a deadline, though the FIN had gone
// and the peer read io.EOF once it ran again. cm's CloseWrite, which says it
// waits only for room to post the end of the stream and never for the peer,
// is this one over XRC.
func TestCloseWriteReturnsOncePostedBehindAStalledReceiver(t *testing.T) {
	w := newWorld(t)
	w.f.AddNode("10.0.122.2", memfabric.NodeConfig{SRQReceives: 1})
	a := w.endpoint("10.0.122.1", 7000, longTimers, func(c *Config) { c.HandshakeTimeout = 5 * time.Second })
	b := w.endpoint("10.0.122.2", 7000, longTimers)
	c, d := pair(t, a, b)
	b.p.PauseReceives()
	ctx := ctxT(t, 10*time.Second)
	for _, m := range []string{"x", "y"} { // the second waits behind the first (RNR)
		if err := c.Send(ctx, []byte(m)); err != nil {
			t.Fatal(err)
		}
	}
	start := time.Now()
	if err := c.CloseWrite(); err != nil {
		t.Fatalf("CloseWrite with its FIN posted behind a stalled receiver: %v, want nil", err)
	}
	if el := time.Since(start); el > 4*time.Second { // a hang bound: the old wait was the 5 s timeout
		t.Fatalf("CloseWrite took %v: it waited for the stalled receiver", el)
	}
	b.p.ResumeReceives()
	buf := make([]byte, 16)
	for _, m := range []string{"x", "y"} {
		n, err := d.Recv(ctx, buf)
		if err != nil || string(buf[:n]) != m {
			t.Fatalf("Recv: %q, %v; want %q", buf[:n], err, m)
		}
	}
	if _, err := d.Recv(ctx, buf); err != io.EOF {
		t.Fatalf("after the messages: %v, want io.EOF", err)
	}
	if err := c.CloseWrite(); err != nil {
		t.Fatalf("CloseWrite again: %v, want nil", err)
	}
	roundTrip(t, d, c, []byte("reply"))
	if c.Err() != nil || d.Err() != nil {
		t.Fatalf("Err: %v / %v", c.Err(), d.Err())
	}
}
