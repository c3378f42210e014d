package xrc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// slowSendFailure holds, once armed, what the engine's send polls took
// until release: a send to a dead peer fails only when its INI has
// exhausted its retries, which on a real device takes long (here the
// failed keepalive to the dead peer, and so the recovery whose MOVE the
// dead node refuses, NO_LISTENER, waits).
type slowSendFailure struct {
	kernel.Kernel
	armed   atomic.Bool
	release chan struct{}
}

func (k *slowSendFailure) PollSend(ctx context.Context, q kernel.QP, out []kernel.SendCompletion) (int, error) {
	n, err := k.Kernel.PollSend(ctx, q, out)
	if k.armed.Load() {
		select {
		case <-k.release:
		case <-ctx.Done():
		}
	}
	return n, err
}

// halfClosedPeer connects a sender at 10.0.N.2 to a receiver r at
// 10.0.N.1 whose send polls k holds once armed, has the sender send its
// last words and half-close, and waits for r to take the half FIN.
func halfClosedPeer(t *testing.T, n byte, ropts, sopts []func(*Config)) (k *slowSendFailure, r, s *proc, rc *Conn) {
	w := newWorld(t)
	k = &slowSendFailure{release: make(chan struct{})}
	t.Cleanup(func() { close(k.release) }) // before the endpoints close (cleanups run last first)
	r = w.wrappedEndpoint(fmt.Sprintf("10.0.%d.1", n), 7000, func(kk kernel.Kernel) kernel.Kernel { k.Kernel = kk; return k }, ropts...)
	s = w.endpoint(fmt.Sprintf("10.0.%d.2", n), 7000, sopts...)
	sc, rc := pair(t, s, r)
	roundTrip(t, rc, sc, []byte("up"))
	if err := sc.Send(ctxT(t, 5*time.Second), []byte("last words")); err != nil {
		t.Fatal(err)
	}
	if err := sc.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "r took s's half FIN", func() (bool, string) {
		r.mu.Lock()
		defer r.mu.Unlock()
		return rc.finRcvd, ""
	})
	return k, r, s, rc
}

// requireNoFailureAfterHalfFIN checks that rc, whose sender half-closed
// and died, ended with no failure and still gives the last words, then EOF.
func requireNoFailureAfterHalfFIN(t *testing.T, rc *Conn, what string) {
	t.Helper()
	if err := rc.Err(); err != nil {
		t.Errorf("Err() after the peer's half FIN and its death (its INI's DREQ)%s: %v, want nil", what, err)
	}
	ctx := ctxT(t, 5*time.Second)
	buf := make([]byte, 32)
	n, err := rc.Recv(ctx, buf)
	if err != nil || string(buf[:n]) != "last words" {
		t.Fatalf("Recv: %q, %v; want the last words", buf[:n], err)
	}
	if _, err := rc.Recv(ctx, buf); !errors.Is(err, io.EOF) {
		t.Errorf("Recv after the last words: %v, want io.EOF", err)
	}
}

// The peer sent, half-closed (CloseWrite) and died: its INI's DREQ reached
// us. Err's doc: after a half FIN the peer's death is no failure (as over
// RC, where a FIN then a disconnect is all such a peer leaves); only its
// silence is. The connection ended one way or the other by timing: where
// our keepalive's failure came first (the MOVE refused NO_LISTENER,
// sendGone) Err said nil; where the janitor's verdict on the DREQ came
// first (half an idle timeout after it, or a heartbeat after it once the
// SRQ drained) it failed the connection with errIdle, the label of a
// silent sender, and Err said ErrPeerGone (cm's Stats.Errors 1: the flaky
// TestStatsPeerFinThenDeathWithoutCallsNotAnError/XRC). The send
// completions held, the janitor's verdict comes first every run.
func TestHalfFINThenDREQIsNoFailure(t *testing.T) {
	k, r, s, rc := halfClosedPeer(t, 68, nil, nil)
	k.armed.Store(true)
	s.p.Kill() // its INI's CM id sends the DREQ to r's link
	eventually(t, "the DREQ marked the connection's sender gone", func() (bool, string) {
		r.mu.Lock()
		defer r.mu.Unlock()
		return !rc.goneAt.IsZero() || rc.err != nil, ""
	})
	eventually(t, "the connection ended", func() (bool, string) {
		r.mu.Lock()
		defer r.mu.Unlock()
		return rc.err != nil, ""
	})
	r.mu.Lock()
	sendGone := rc.sendGone
	r.mu.Unlock()
	if sendGone != nil {
		t.Fatalf("the keepalive's failure came first (sendGone %v): the send polls were not held", sendGone)
	}
	requireNoFailureAfterHalfFIN(t, rc, "")
}

// As TestHalfFINThenDREQIsNoFailure, but with the idle verdict falling due
// before the DREQ's: the peer half-closed, said nothing more for most of
// our idle timeout (its keepalives are an IdleTimeout-Heartbeat apart at
// worst where IdleTimeout is 2*Heartbeat, the least Config allows), and
// died. Its INI's DREQ reached us (goneAt), but the janitor's look found
// the idle timeout passed before the DREQ's grace did, and failed the
// connection with errIdle, the label of a silent peer: Err said
// ErrPeerGone where the DREQ's verdict, one look later, says nothing.
// d79cf47 made the peer's death no failure only where the DREQ's
// verdict comes first.
func TestHalfFINThenDREQIsNoFailureIdleFirst(t *testing.T) {
	k, r, s, rc := halfClosedPeer(t, 69,
		[]func(*Config){func(c *Config) { c.Heartbeat, c.IdleTimeout = time.Second, 4*time.Second }},
		[]func(*Config){longTimers}) // the sender sends no keepalives of its own
	r.mu.Lock()
	seen := rc.lastSeen
	r.mu.Unlock()
	time.Sleep(time.Until(seen.Add(3500 * time.Millisecond))) // half a heartbeat short of r's idle timeout
	k.armed.Store(true)
	s.p.Kill() // its INI's CM id sends the DREQ to r's link
	eventually(t, "the connection ended", func() (bool, string) {
		r.mu.Lock()
		defer r.mu.Unlock()
		return rc.err != nil, ""
	})
	r.mu.Lock()
	sendGone, goneAt := rc.sendGone, rc.goneAt
	r.mu.Unlock()
	if sendGone != nil || goneAt.IsZero() {
		t.Fatalf("setup: sendGone %v, goneAt %v: want the DREQ seen and no keepalive failure", sendGone, goneAt)
	}
	requireNoFailureAfterHalfFIN(t, rc, ", the idle timeout first")
}
