package xrc

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// A dial whose acceptor's request for the reverse leg was taken, but whose
// answer was lost (the acceptor's CM timed out), has a dead acceptor half:
// the acceptor sends an ABORT and its half fails. The dialer had taken the
// leg, so the ABORT named no dial still waiting and was refused as a stray
// one: Dial returned a connection that heard nothing until its idle
// timeout. The ABORT ends it now, with the acceptor's word.
func TestDialReverseAnswerLostAborts(t *testing.T) {
	w := newWorld(t)
	a := w.endpoint("10.0.106.1", 7000, func(c *Config) {
		c.HandshakeTimeout = time.Hour
		c.IdleTimeout = time.Hour // the idle timeout does not end it
	})
	k := &unansweredReverse{answerLost: true}
	b := w.wrappedEndpoint("10.0.106.2", 7000, func(kk kernel.Kernel) kernel.Kernel { k.Kernel = kk; return k },
		func(c *Config) { c.HandshakeTimeout = 2 * time.Second })
	// Uplinks both ways, to other processes on the nodes: the dial's
	// forward leg and its reverse leg are virtual, on TGTs other legs
	// hold, and b's failed half takes neither TGT down.
	o := w.endpoint("10.0.106.2", 7001)
	c1, d1 := pair(t, a, o)
	p := w.endpoint("10.0.106.1", 7001)
	c2, d2 := pair(t, b, p)
	others := []*Conn{c1, d1, c2, d2}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := a.Dial(ctx, b.Addr().String())
	if err == nil {
		// Taken, the leg completed the dial: the ABORT must end it.
		t.Log("the dial returned a connection")
		_, err = c.Recv(ctx, make([]byte, 64))
		c.Close()
	}
	if !errors.Is(err, errReverseAborted) {
		t.Fatalf("the dial (or its connection's Recv) failed with %v; want the acceptor's ABORT", err)
	}
	requireNoHalfConn(t, b)
	for _, c := range others {
		c.Close()
	}
	requireReleased(t, w, a, b)
}
