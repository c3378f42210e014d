package xrc

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// A two-exchange dial whose acceptor's half fails while its reciprocal
// request is on its way (here by its idle timeout: the dialer's keepalives
// wait at its INI to the acceptor's node, which a stopped receiver there
// stalls, and the request is slow). The dialer takes the reverse leg and
// its Dial returns the connection; the acceptor, reading the ACCEPT for a
// half that failed, sent nothing on the leg, and the dialer's connection
// was silent until its idle timeout (a minute here), 3 runs in 3. A FIN on
// the leg ends it now. (Where the acceptor's endpoint closes instead, the
// dialer learns at once without it: its first frame or keepalive finds the
// SRQ gone.)
func TestReciprocalAnsweredToFailedHalf(t *testing.T) { reciprocalToFailedHalf(t, false) }

// The same where the acceptor's uplink to the dialer's node has no other
// leg by the time the ACCEPT comes (its last one, to q, ended, and q, which
// made the TGT there, still holds it for that leg): the dial's reference
// was the last, and letting it go tore the uplink down before the FIN was
// posted, so nothing went, 3 runs in 3. The link's DREQ went to the TGT's
// maker, q, not to the dialer, which opened the TGT by number: its
// connection was silent until its idle timeout.
func TestReciprocalAnsweredToFailedHalfLastLeg(t *testing.T) { reciprocalToFailedHalf(t, true) }

// reciprocalToFailedHalf runs the two tests above; with lastLeg, b's leg to
// q ends before the ACCEPT comes.
func reciprocalToFailedHalf(t *testing.T, lastLeg bool) {
	w := newWorld(t)
	w.f.AddNode("10.0.101.2", memfabric.NodeConfig{SRQReceives: 4})
	a := w.endpoint("10.0.101.1", 7000, func(c *Config) { c.IdleTimeout = time.Minute })
	// q keeps b's uplink to a's node up; with lastLeg, q made the TGT that
	// uplink reaches and keeps it, for b's leg, until its idle timeout.
	q := w.endpoint("10.0.101.1", 7001, func(c *Config) {
		if lastLeg {
			c.IdleTimeout = 3 * time.Second
		}
	})
	rk := &holdReciprocal{held: make(chan struct{}), release: make(chan struct{})}
	b := w.wrappedEndpoint("10.0.101.2", 7000, func(k kernel.Kernel) kernel.Kernel { rk.Kernel = k; return rk })
	p := w.endpoint("10.0.101.2", 7001, longTimers) // the receiver that stops
	toP, _ := pair(t, a, p)
	cq, dq := pair(t, q, b)
	ctx := ctxT(t, 10*time.Second)
	stallBehind(t, ctx, toP, p)
	dialed, half := halfFailedUnderReciprocal(t, a, b, rk)
	if err := connErr(half); !errors.Is(err, errIdle) {
		t.Fatalf("setup: b's half ended with %v, not by its idle timeout", err)
	}
	if lastLeg {
		q.p.PauseReceives() // nor does a FIN end that leg
		t.Cleanup(q.p.ResumeReceives)
		dq.Close()
		b.mu.Lock()
		refs := b.uplinks[0].refs
		b.mu.Unlock()
		if refs != 1 {
			t.Fatalf("setup: b's uplink to a's node has %d references, want the dial's alone", refs)
		}
	}
	close(rk.release)
	r := <-dialed
	if r.err != nil {
		t.Fatalf("dial: %v", r.err)
	}
	if _, err := r.c.Recv(ctxT(t, 5*time.Second), make([]byte, 8)); err != io.EOF {
		t.Fatalf("the dialer's connection, whose acceptor's half is gone: Recv says %v, want io.EOF", err)
	}
	p.p.ResumeReceives()
	q.p.ResumeReceives()
	for _, c := range []*Conn{r.c, toP, cq, dq} {
		c.Close()
	}
	requireReleased(t, w, a, b, p, q)
}

// stallBehind stops p's receives and sends it 12 frames on to, whose node
// has 4 receives: 4 land, and the rest wait at the sender's INI.
func stallBehind(t *testing.T, ctx context.Context, to *Conn, p *proc) {
	t.Helper()
	p.p.PauseReceives()
	t.Cleanup(p.p.ResumeReceives) // before the endpoints close
	if err := sendSeq(ctx, to, 0, 12); err != nil {
		t.Fatal(err)
	}
}

// halfFailedUnderReciprocal dials b from a with b's reciprocal request held
// by rk, and waits until b's inbound half of the dial has failed (its idle
// timeout, while the request waits).
func halfFailedUnderReciprocal(t *testing.T, a, b *proc, rk *holdReciprocal) (<-chan dialResult, *Conn) {
	t.Helper()
	rk.armed.Store(true)
	dialed := dialLater(t, a, b)
	awaitSetup(t, rk.held, "the reciprocal request never came")
	halves := inboundHalves(b)
	if len(halves) != 1 {
		t.Fatalf("setup: %d halves at b", len(halves))
	}
	eventually(t, "b's half ended", func() (bool, string) {
		return connErr(halves[0]) != nil, ""
	})
	return dialed, halves[0]
}

// inboundHalves returns b's inbound connections not up yet.
func inboundHalves(b *proc) []*Conn {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []*Conn
	for c := range b.conns {
		if c.inbound && !c.isReady {
			out = append(out, c)
		}
	}
	return out
}
