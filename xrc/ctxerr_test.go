package xrc

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A call that its context ends fails with an *OpError naming the operation
// and the address, wrapping the context's error, as OpError's doc has it
// ("the error of a failed Endpoint or Conn operation", Op "accept", "send",
// "recv") and as Dial's does. Accept, AcceptIn, Send (waiting for credits)
// and Recv returned the bare context.DeadlineExceeded or context.Canceled:
// errors.As found no *OpError, and the address was lost.
func TestContextEndIsOpError(t *testing.T) {
	w := newWorld(t)
	a := w.endpoint("10.0.0.1", 7001, func(c *Config) { c.RecvWindow = 2 })
	b := w.endpoint("10.0.0.2", 7001, func(c *Config) { c.RecvWindow = 2 })
	ca, cb := pair(t, a, b)
	ctx := ctxT(t, 10*time.Second)
	// The peer's window is 2 and it reads nothing: the third Send waits
	// for credits.
	for i := range 2 {
		if err := ca.Send(ctx, []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	short := func() context.Context { return ctxT(t, 20*time.Millisecond) }
	buf := make([]byte, 16)
	for _, tc := range []struct {
		name, op string
		call     func() error
		want     error
	}{
		{"Accept", "accept", func() error { _, err := b.Accept(short()); return err }, context.DeadlineExceeded},
		{"AcceptIn", "accept", func() error { _, err := b.AcceptIn(canceled, b.Term()); return err }, context.Canceled},
		{"Recv", "recv", func() error { _, err := ca.Recv(short(), buf); return err }, context.DeadlineExceeded},
		{"Send", "send", func() error { return ca.Send(short(), []byte("waits")) }, context.DeadlineExceeded},
	} {
		err := tc.call()
		var oe *OpError
		if !errors.As(err, &oe) || oe.Op != tc.op || oe.Addr == "" || !errors.Is(err, tc.want) {
			t.Errorf("%s as its context ends: %T %v, want an *OpError %q with the address, wrapping %v", tc.name, err, err, tc.op, tc.want)
		}
	}
	// The connection is still up: what was sent arrives.
	for i := range 2 {
		if n, err := cb.Recv(ctx, buf); err != nil || n != 1 || buf[0] != byte(i) {
			t.Fatalf("message %d: %q %v", i, buf[:n], err)
		}
	}
	ca.Close()
	cb.Close()
}
