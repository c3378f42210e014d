package xrc

import (
	"fmt"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// Two one-off send poll failures apart on an uplink whose only leg is a
// first-contact dial held for its reverse leg (firstHeld): the recovery
// the first started sent nothing that proves the new INI's poll (its
// keepalive would complete the acceptor's half: d33f63f), so the second,
// on the dial's first frame once it was up, was taken for a poll that
// fails on every INI (errSendPoll) and failed the connection, as in
// TestEndpointSendPollFailsTwiceApart before 963f5b0.
func TestHeldDialSendPollFailsTwiceApart(t *testing.T) {
	w := newWorld(t)
	p := &pollFail{}
	a := w.wrappedEndpoint("10.0.97.7", 7000, func(k kernel.Kernel) kernel.Kernel { p.Kernel = k; return p }, longTimers)
	g := newHoldRTU(t) // b dials nothing but its reciprocal request
	b := w.wrappedEndpoint("10.0.97.8", 7000, func(k kernel.Kernel) kernel.Kernel { g.Kernel = k; return g }, longTimers)
	ctx := ctxT(t, 10*time.Second)
	type res struct {
		c   *Conn
		err error
	}
	dialed := make(chan res, 1)
	go func() {
		c, err := a.dialOnce(ctx, b.Addr(), true)
		dialed <- res{c, err}
	}()
	awaitSetup(t, g.held, "the acceptor sent no RTU")
	var c *Conn
	eventually(t, "the dial held, its probe polled", func() (bool, string) {
		a.mu.Lock()
		defer a.mu.Unlock()
		for k := range a.conns {
			c = k
		}
		if c == nil || len(a.uplinks) == 0 || a.uplinks[0].cur == nil {
			return false, "no dial"
		}
		return c.firstHeld && len(a.uplinks[0].cur.waiters) == 0, fmt.Sprint("held ", c.firstHeld)
	})
	p.armed.Store(true)
	c.post(kindHeartbeat, nil, nil) // the janitor's probe: its poll fails
	eventually(t, "the recovery done and its posts polled", func() (bool, string) {
		a.mu.Lock()
		defer a.mu.Unlock()
		u := a.uplinks[0]
		return a.recoveries.Load() == 1 && u.state == upUp && !u.settling && len(u.cur.waiters) == 0, ""
	})
	p.armed.Store(true) // the next poll that takes a completion fails
	close(g.release)
	r := <-dialed
	if r.err != nil {
		t.Fatalf("dial: %v", r.err)
	}
	defer r.c.Close()
	d, err := b.Accept(ctx)
	if err != nil {
		t.Fatalf("accept: %v", err)
	}
	defer d.Close()
	eventually(t, "the second recovery done", func() (bool, string) {
		a.mu.Lock()
		defer a.mu.Unlock()
		if r.c.err != nil || len(a.uplinks) == 0 {
			return true, ""
		}
		u := a.uplinks[0]
		return a.recoveries.Load() == 2 && u.state == upUp && !u.settling, fmt.Sprint(a.recoveries.Load(), " recoveries")
	})
	if err := connErr(r.c); err != nil {
		t.Fatalf("after two send poll failures apart: %v", err)
	}
	roundTrip(t, r.c, d, []byte("forward"))
	roundTrip(t, d, r.c, []byte("reverse"))
}
