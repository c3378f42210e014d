package xrc

import (
	"errors"
	"io"
	"testing"
	"time"
)

// The peer half-closed, then a recovery's MOVE went unanswered, and the CM
// said so (-ETIMEDOUT, RejectError.Timeout) before the MOVE's deadline did:
// the peer's silence, as when the deadline finds it (errUnanswered), a
// failure even after its half FIN. It was taken for its death, which Err
// excuses after a half FIN: nil.
func TestEndpointHalfCloseThenCMTimeoutIsFailure(t *testing.T) {
	w := newWorld(t)
	r := w.endpoint("10.0.7.6", 7000, longTimers)
	// Once armed, the next send poll fails (a recovery begins), and the
	// CM gives up on every request begun after: the recovery's MOVE.
	s, u, pf := w.unansweredAfterPollFail("10.0.7.5")
	cs, cr := pair(t, s, r)
	ctx := ctxT(t, 10*time.Second)
	if err := cr.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.Recv(ctx, make([]byte, 64)); !errors.Is(err, io.EOF) {
		t.Fatalf("recv: %v, want io.EOF", err)
	}
	u.all.Store(true)
	pf.armed.Store(true)
	var err error
	for err == nil {
		err = cs.Send(ctx, []byte("to the silent"))
	}
	if !errors.Is(err, ErrPeerGone) {
		t.Fatalf("send: %v, want ErrPeerGone", err)
	}
	if err := cs.Err(); !errors.Is(err, errUnanswered) {
		t.Fatalf("Err: %v, want the unanswered MOVE (errUnanswered); Send: %v", err, cs.Send(ctx, nil))
	}
}
