package xrc

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Each endpoint receives messages of up to its Config.MaxMessageSize (its
// SRQ's slots), and its senders learn that when a leg is set up: in the
// ACCEPT of a forward or reciprocal leg, in the REQ of a reverse leg that
// rides a ONE_EXCHANGE ACCEPT. A larger Send fails with ErrMessageTooLong,
// sends nothing and leaves the connection as it was.
func TestMaxMessageSizeLearned(t *testing.T) {
	w := newWorld(t)
	a := w.endpoint("10.0.8.1", 7000, func(c *Config) { c.MaxMessageSize = 512 })
	b := w.endpoint("10.0.8.2", 7000, func(c *Config) { c.MaxMessageSize = 1024 })
	ctx := ctxT(t, 5*time.Second)
	for _, c := range legKinds(t, a, b) {
		limit := 512
		if c.toB {
			limit = 1024
		}
		if got := c.snd.MaxMessageSize(); got != limit {
			t.Errorf("%s: MaxMessageSize %d, want %d", c.name, got, limit)
		}
		if err := c.snd.Send(ctx, make([]byte, limit+1)); !errors.Is(err, ErrMessageTooLong) {
			t.Errorf("%s: a message of %d bytes: %v, want ErrMessageTooLong", c.name, limit+1, err)
		}
		msg := make([]byte, limit)
		msg[limit-1] = 0xAB
		roundTrip(t, c.snd, c.rcv, msg) // the largest goes, and nothing came before it
	}
}

func TestMaxMessageSizeRange(t *testing.T) {
	w := newWorld(t)
	for _, n := range []int{-1, MinMessageSize - 1, MaxMessageSize + 1} {
		_, err := NewEndpoint(context.Background(), Config{Process: w.f.Node("10.0.8.3").Process(),
			Addr: "10.0.8.3:7000", DomainDir: t.TempDir() + "/goxrc", MaxMessageSize: n})
		if err == nil {
			t.Errorf("MaxMessageSize %d: an endpoint", n)
		}
	}
}
