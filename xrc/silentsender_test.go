package xrc

import (
	"errors"
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
