package xrc

import (
	"context"
	"errors"
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
	w := newWorld(t)
	k := &slowSendFailure{release: make(chan struct{})}
	t.Cleanup(func() { close(k.release) }) // before the endpoints close (cleanups run last first)
	r := w.wrappedEndpoint("10.0.68.1", 7000, func(kk kernel.Kernel) kernel.Kernel { k.Kernel = kk; return k })
	s := w.endpoint("10.0.68.2", 7000)
	sc, rc := pair(t, s, r)
	roundTrip(t, rc, sc, []byte("up"))

	ctx := ctxT(t, 5*time.Second)
	if err := sc.Send(ctx, []byte("last words")); err != nil {
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
	if err := rc.Err(); err != nil {
		t.Errorf("Err() after the peer's half FIN and its death (its INI's DREQ): %v, want nil", err)
	}
	buf := make([]byte, 32)
	n, err := rc.Recv(ctx, buf)
	if err != nil || string(buf[:n]) != "last words" {
		t.Fatalf("Recv: %q, %v; want the last words", buf[:n], err)
	}
	if _, err := rc.Recv(ctx, buf); !errors.Is(err, io.EOF) {
		t.Errorf("Recv after the last words: %v, want io.EOF", err)
	}
}
