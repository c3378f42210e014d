package xrc

import (
	"errors"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// holdDisconnect blocks the Disconnect of one CM id (armed) until release.
type holdDisconnect struct {
	kernel.Kernel
	mu      sync.Mutex
	id      kernel.ID
	held    chan struct{}
	release chan struct{}
}

func (h *holdDisconnect) Disconnect(id kernel.ID) error {
	h.mu.Lock()
	buf := make([]byte, 4096)
	hit := h.id != 0 && id == h.id && strings.Contains(string(buf[:runtime.Stack(buf, false)]), ").recover(")
	if hit {
		h.id = 0
	}
	h.mu.Unlock()
	if hit {
		close(h.held)
		<-h.release
	}
	return h.Kernel.Disconnect(id)
}

func upOf(p *proc, c *Conn) (upState, *iniQP) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return c.up.state, c.up.cur
}

// A recovery with no VIRT leg to move must not set the uplink UP and then,
// after disconnecting the old link, UP again: a failure of the new INI in
// between starts a second recovery, and the first put the uplink back UP on
// the failed INI under its feet (a third started at the next send).
func TestRecoveryHoldsUplinkThroughOldLinkDisconnect(t *testing.T) {
	w := newWorld(t)
	h := &holdDisconnect{held: make(chan struct{}), release: make(chan struct{})}
	hs := func(c *Config) { longTimers(c); c.HandshakeTimeout = 30 * time.Second }
	s := w.wrappedEndpoint("10.0.90.1", 7000, func(k kernel.Kernel) kernel.Kernel { h.Kernel = k; return h }, hs)
	g := &stallMoves{release: make(chan struct{})}
	released := false
	defer func() {
		if !released {
			close(g.release)
		}
	}()
	r1 := w.endpoint("10.0.90.2", 7001, longTimers)
	r3 := w.endpoint("10.0.90.2", 7003, longTimers)
	r2 := w.wrappedEndpoint("10.0.90.2", 7002, func(k kernel.Kernel) kernel.Kernel { g.Kernel = k; return g }, longTimers)
	s1, _ := pair(t, s, r1)
	s3, _ := pair(t, s, r3)
	_, q0 := upOf(s, s1)
	h.mu.Lock()
	h.id = q0.aid
	h.mu.Unlock()
	r3.p.Kill()
	if err := sendErr(t, s3); !errors.Is(err, ErrPeerGone) {
		t.Fatalf("to the dead r3: %v", err)
	}
	select {
	case <-h.held: // recover #1: UP on q1, now disconnecting q0
	case <-time.After(5 * time.Second):
		t.Fatal("recovery never disconnected the old link")
	}
	st, q1 := upOf(s, s1)
	t.Logf("recover #1 in its Disconnect: state %v, cur new: %v", st, q1 != q0)
	s2, c2 := pair(t, s, r2) // a new leg on q1
	r1.p.Kill()
	if err := sendErr(t, s1); !errors.Is(err, ErrPeerGone) {
		t.Fatalf("to the dead r1: %v", err)
	}
	eventually(t, "recover #2 under way", func() (bool, string) {
		st, _ := upOf(s, s2)
		return st == upRecovering, st.String()
	})
	recs := s.Stats().Recoveries
	close(h.release) // recover #1 finishes while #2 waits for r2's PHYS MOVE
	time.Sleep(200 * time.Millisecond)
	st, cur := upOf(s, s2)
	stEnd := st
	t.Logf("after recover #1 ended, recover #2 still stalled: state %v, cur==q1 %v, recoveries %d (was %d)", st, cur == q1, s.Stats().Recoveries, recs)
	// A send on s2 while #2 stalls.
	sent := make(chan error, 1)
	go func() { sent <- s2.Send(ctxT(t, 10*time.Second), []byte("during")) }()
	time.Sleep(300 * time.Millisecond)
	st, cur = upOf(s, s2)
	t.Logf("after a send: state %v, cur==q1 %v, recoveries %d", st, cur == q1, s.Stats().Recoveries)
	recs2 := s.Stats().Recoveries
	close(g.release)
	released = true
	if err := <-sent; err != nil {
		t.Fatalf("send during: %v", err)
	}
	buf := make([]byte, 32)
	n, err := c2.Recv(ctxT(t, 5*time.Second), buf)
	t.Logf("r2 got %q %v; sender %+v", buf[:n], err, s.Stats())
	if err == nil {
		roundTrip(t, s2, c2, []byte("after"))
	}
	if stEnd == upUp || recs2 > 2 {
		t.Fatalf("a second recovery was under way, yet the first set the uplink UP on the failed INI (state %v) and a third recovery started (recoveries %d, then %d after one send)", stEnd, recs, recs2)
	}
	if err != nil {
		t.Fatalf("r2 recv: %v", err)
	}
}
