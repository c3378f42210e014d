package xrc

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// destroySeen closes destroyed once its process destroys the QP in qp.
type destroySeen struct {
	wrapper
	qp        atomic.Uint64
	destroyed chan struct{}
	once      sync.Once
}

func (k *destroySeen) DestroyQP(q kernel.QP) error {
	err := k.Kernel.DestroyQP(q)
	if uint64(q) == k.qp.Load() {
		k.once.Do(func() { close(k.destroyed) })
	}
	return err
}

// The FIN to a failed half (finAcceptedLocked), posted on an INI held up
// behind a stopped receiver, where the dial's reference it took over is
// the uplink's last (its other leg, to q, gone: lastLeg's case in
// reciprocalToFailedHalf): let go of once the FIN was posted, not once it
// completed, that reference tore the link down under the FIN, and the INI
// went with the FIN in its queue. The DREQ went to q, the TGT's maker, and
// the dialer's connection heard nothing until its idle timeout (a minute
// here).
func TestFailedHalfFINBehindStallKeepsItsLink(t *testing.T) { failedHalfFINBehindStall(t, false) }

// The same FIN, flushed as the stalled INI fails (q, the receiver it waits
// behind, dies; a holds the TGT, which stays): no FIN went, and the ABORT
// goes instead, as for one that could not be posted (abortTakenLocked).
// Nothing went, and the dialer's connection heard nothing until its idle
// timeout.
func TestFailedHalfFINFlushedAborts(t *testing.T) { failedHalfFINBehindStall(t, true) }

// failedHalfFINBehindStall runs the two tests above; with flushed, q dies
// instead of resuming.
func failedHalfFINBehindStall(t *testing.T, flushed bool) {
	w := newWorld(t)
	w.f.AddNode("10.0.111.1", memfabric.NodeConfig{SRQReceives: 4})
	w.f.AddNode("10.0.111.2", memfabric.NodeConfig{SRQReceives: 4})
	minute := func(c *Config) { c.IdleTimeout = time.Minute }
	a := w.endpoint("10.0.111.1", 7000, minute)
	q := w.endpoint("10.0.111.1", 7001, minute) // makes the TGT of b's uplink to a's node, then stops
	rk := &holdReciprocal{held: make(chan struct{}), release: make(chan struct{})}
	dk := &destroySeen{destroyed: make(chan struct{})}
	b := w.wrappedEndpoint("10.0.111.2", 7000, func(k kernel.Kernel) kernel.Kernel {
		rk.Kernel = k
		dk.Kernel = rk
		return dk
	})
	p := w.endpoint("10.0.111.2", 7001, longTimers) // the receiver that stops
	toP, _ := pair(t, a, p)
	cq, dq := pair(t, q, b)
	ctx := ctxT(t, 10*time.Second)
	stallBehind(t, ctx, toP, p)
	var once sync.Once
	release := func() { once.Do(func() { close(rk.release) }) }
	t.Cleanup(release)
	dialed, _ := halfFailedUnderReciprocal(t, a, b, rk)
	// b's uplink to a's node waits behind q, stopped, and dq's leg goes
	// (its FIN waits there too): the dial's reference is the last.
	stallBehind(t, ctx, dq, q)
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	dq.closeWithin(cctx)
	cancel()
	b.mu.Lock()
	u := b.uplinks[0]
	refs := u.refs
	dk.qp.Store(uint64(u.cur.qp))
	b.mu.Unlock()
	if refs != 1 {
		t.Fatalf("setup: b's uplink to a's node has %d references, want the dial's alone", refs)
	}
	finDone := make(chan struct{})
	hook := func() { close(finDone) }
	b.testFINPosted.Store(&hook)
	release()
	r := <-dialed
	if r.err != nil {
		t.Fatalf("dial: %v", r.err)
	}
	awaitSetup(t, finDone, "b posted no FIN to its failed half")
	b.mu.Lock()
	torn := u.state != upUp
	b.mu.Unlock()
	if torn {
		// The link's end under way: let it come to pass before q
		// resumes, so that what follows reads what it did to the FIN.
		awaitSetup(t, dk.destroyed, "b's INI, disconnected, was never destroyed")
	}
	if flushed {
		q.p.Kill()
		if _, err := r.c.Recv(ctxT(t, 5*time.Second), make([]byte, 8)); !errors.Is(err, errReverseAborted) {
			t.Fatalf("the dialer's connection, whose acceptor's FIN was flushed: Recv says %v, want the acceptor's ABORT", err)
		}
		p.p.ResumeReceives()
		for _, c := range []*Conn{r.c, toP} {
			c.Close()
		}
		return
	}
	q.p.ResumeReceives()
	if _, err := r.c.Recv(ctxT(t, 5*time.Second), make([]byte, 8)); err != io.EOF {
		t.Fatalf("the dialer's connection, whose acceptor's half is gone: Recv says %v, want io.EOF (b's link torn down under the FIN: %v)", err, torn)
	}
	p.p.ResumeReceives()
	for _, c := range []*Conn{r.c, toP, cq, dq} {
		c.Close()
	}
	requireReleased(t, w, a, b, p, q)
}
