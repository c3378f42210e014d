package xrc

import (
	"errors"
	"fmt"
	"io"
	"testing"
	"time"
)

// The sender's node goes off without a word (a power cut: no DREQ, no
// FIN). The acceptor's sends there fail and its uplink to the node is not
// rebuilt: it takes the sender for dead and lets go of its leg and TGT
// handle, and of the physical link's CM id as well: kept for a DREQ that
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
