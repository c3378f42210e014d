package xrc

import (
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"testing"
	"time"
)

// The sender's node goes off without a word (a power cut: no DREQ, no
// FIN). The acceptor's sends there fail and its uplink to the node is not
// rebuilt: it lets go of its leg and TGT handle, and, the link's linger
// over, of the physical link's CM id as well: kept for a DREQ that
// never comes, the id stayed until the endpoint closed, one for every
// sender INI that died so (found by a chaos run).
func TestEndpointPassiveLinkEndsWithSilentSender(t *testing.T) {
	w := newWorld(t)
	s, r := w.endpoint("10.0.183.1", 7000), w.endpoint("10.0.183.2", 7000)
	sc, rc := pair(t, s, r) // PHYS: r's passive link to s's INI
	roundTrip(t, sc, rc, []byte("before"))
	w.f.Node("10.0.183.1").PowerOff()
	if _, err := rc.Recv(ctxT(t, 10*time.Second), make([]byte, 8)); !errors.Is(err, ErrPeerGone) {
		t.Fatalf("Recv from the node that went off: %v, want ErrPeerGone", err)
	}
	rc.Close()
	requireReleased(t, w, r)
}

// The sender's node goes off after its connection to the TGT's creator
// ended by its FINs, while its uplink stays for a connection to another
// process of the creator's node. The creator has no leg on its physical
// link any more, so nothing of its own fails to take the sender for dead,
// and no DREQ comes: the link lingers an idle timeout, then ends. It stayed
// until the endpoint closed, its CM id one more kernel handle for every
// sender whose node went off so.
func TestEndpointPassiveLinkEndsWithSenderSilentAfterFIN(t *testing.T) {
	w := newWorld(t)
	s := w.endpoint("10.0.186.1", 7000)
	r1, r2 := w.endpoint("10.0.186.2", 7001), w.endpoint("10.0.186.2", 7002)
	sc1, rc1 := pair(t, s, r1) // PHYS: r1 creates the TGT, its passive link
	sc2, rc2 := pair(t, s, r2) // VIRT: r2 opens the TGT; s keeps its uplink for it
	roundTrip(t, sc2, rc2, []byte("before"))
	if err := sc1.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := rc1.Recv(ctxT(t, 10*time.Second), make([]byte, 8)); !errors.Is(err, io.EOF) {
		t.Fatalf("Recv after the sender's Close: %v, want EOF", err)
	}
	rc1.Close()
	eventually(t, "r1's connection released", func() (bool, string) {
		st := r1.Stats()
		return st.Conns == 0 && st.LocalCounts == 0, fmt.Sprintf("%+v", st)
	})
	r1.mu.Lock()
	links := len(r1.passive)
	r1.mu.Unlock()
	if links != 1 {
		t.Fatalf("setup: r1 holds %d physical links, want s's (its uplink is up for r2)", links)
	}
	w.f.Node("10.0.186.1").PowerOff()
	if _, err := rc2.Recv(ctxT(t, 10*time.Second), make([]byte, 8)); !errors.Is(err, ErrPeerGone) {
		t.Fatalf("r2's Recv from the node that went off: %v, want ErrPeerGone", err)
	}
	rc2.Close()
	requireReleased(t, w, r1, r2)
}

// The janitor looks at a physical link once a tick (Heartbeat/2) and ends
// it an idle timeout after a look first found no leg on it. A leg that came
// and went between two looks (a short connection, the sender's next one
// through the TGT) went unseen: the link ended at the next look, just after
// that leg, not an idle timeout after it, and the sender's next leg lost
// the DREQ's word of its death. The looks are driven by hand here (the
// janitor's tick is half an hour).
func TestEndpointPassiveLinkLingersAfterLegBetweenLooks(t *testing.T) {
	w := newWorld(t)
	s := w.endpoint("10.0.188.1", 7000, longTimers)
	r1, r2 := w.endpoint("10.0.188.2", 7001, longTimers), w.endpoint("10.0.188.2", 7002, longTimers)
	end := func(c, d *Conn) {
		c.Close()
		d.Close()
		eventually(t, "r1's connection released", func() (bool, string) {
			st := r1.Stats()
			return st.Conns == 0 && st.LocalCounts == 0, fmt.Sprintf("%+v", st)
		})
	}
	c1, d1 := pair(t, s, r1) // PHYS: r1 creates the TGT, its passive link
	pair(t, s, r2)           // VIRT: r2 keeps the TGT and s's uplink
	end(c1, d1)
	var ended atomic.Bool // the janitor ended the link (lingerLocked calls end)
	r1.mu.Lock()
	for _, l := range r1.passive {
		end := l.end
		l.end = func() { ended.Store(true); end() }
	}
	links := len(r1.passive)
	r1.mu.Unlock()
	if links != 1 {
		t.Fatalf("setup: r1 holds %d physical links, want s's", links)
	}
	tick := r1.cfg.Heartbeat / 2
	t0 := time.Now()
	look := func(i int) {
		r1.mu.Lock()
		r1.lingerLocked(t0.Add(time.Duration(i) * tick))
		r1.mu.Unlock()
	}
	n := int(r1.cfg.IdleTimeout/tick) + 1 // the first look past the link's linger
	for i := range n {
		look(i)
	}
	if ended.Load() {
		t.Fatal("setup: r1 ended s's link before its linger was up")
	}
	c3, d3 := pair(t, s, r1) // VIRT: the sender's next leg, through the link's TGT
	end(c3, d3)              // ended before the next look
	look(n)
	if ended.Load() {
		t.Fatal("r1 ended s's link at the look just after its last leg ended, not an idle timeout after")
	}
	for i := n + 1; i <= 2*n && !ended.Load(); i++ {
		look(i)
	}
	if !ended.Load() {
		t.Fatal("r1 kept s's link past an idle timeout (and a look) after its last leg ended")
	}
}
