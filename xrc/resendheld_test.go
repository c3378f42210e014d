package xrc

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/goxrc/goxrc/internal/kernel"
)

// A first-contact dial waiting for the acceptor's reciprocal leg
// (firstHeld), whose uplink a failed send poll recovers: the recovery's
// keepalive that proves the new INI's poll went as a real keepalive, the
// acceptor's half's first frame, where the dial's keepalives go as credit
// frames (post). Given up as the acceptor's RTU was on its way, the dial's
// FIN was then no first frame but a close, and once the RTU went, Accept
// returned a connection whose Dial had failed.
func TestResendKeepaliveSparesHeldDial(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, b, _, g, dialed := heldDialRecovered(t, ctx, "10.0.97.5", "10.0.97.6")
	cancel() // the dial's deadline, as the RTU is on its way
	r := <-dialed
	if r.c != nil {
		r.c.Close()
	}
	if !errors.Is(r.err, context.Canceled) {
		t.Fatalf("dial: %v, want its context's end", r.err)
	}
	close(g.release)
	requireNoHalfConn(t, b)
}

// heldDialRecovered starts a's dial to b (one attempt, within ctx), b
// holding its RTU (g) so that the dial stays held for its reverse leg
// (firstHeld); then it fails the send poll of the janitor's next probe (p)
// and waits until the recovery that follows is done and its posts polled.
func heldDialRecovered(t *testing.T, ctx context.Context, aIP, bIP string) (a, b *proc, p *pollFail, g *holdRTU, dialed <-chan dialResult) {
	t.Helper()
	w := newWorld(t)
	p = &pollFail{}
	a = w.wrappedEndpoint(aIP, 7000, func(k kernel.Kernel) kernel.Kernel { p.Kernel = k; return p }, longTimers)
	g = newHoldRTU(t) // b dials nothing but its reciprocal request
	b = w.wrappedEndpoint(bIP, 7000, func(k kernel.Kernel) kernel.Kernel { g.Kernel = k; return g }, longTimers)
	dialed = dialIn(ctx, a, b)
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
	return a, b, p, g, dialed
}

// requireSecondRecoverySpares waits until p's second uplink recovery (a
// second one-off send poll failure, apart from the first) is done, or c
// failed, and requires c unbroken: a poll that failed once more was not
// taken for one that always fails.
func requireSecondRecoverySpares(t *testing.T, p *proc, c *Conn) {
	t.Helper()
	eventually(t, "the second recovery done", func() (bool, string) {
		p.mu.Lock()
		defer p.mu.Unlock()
		if c.err != nil || len(p.uplinks) == 0 {
			return true, ""
		}
		u := p.uplinks[0]
		return p.recoveries.Load() == 2 && u.state == upUp && !u.settling, fmt.Sprint(p.recoveries.Load(), " recoveries")
	})
	if err := connErr(c); err != nil {
		t.Fatalf("after two send poll failures apart: %v", err)
	}
}
