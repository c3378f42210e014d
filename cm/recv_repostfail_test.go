package cm

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A receive repost that fails after messages were taken in fails the
// connection, but the messages it took are the application's: Recv gives
// each of them, in order, then the failure (ErrPeerGone). The sender's
// Sends succeeded, so none may be lost. A guard (as the xrc engine's
// TestRecvPollErrorDeliversWhatItTook is for the XRC path).
func TestRecvRepostFailureDeliversWhatWasTaken(t *testing.T) {
	a, b, w := fakePair(t, fakeOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	msgs := []string{"one", "two", "three", "four", "five"}
	for _, m := range msgs {
		if err := a.Send(ctx, []byte(m)); err != nil {
			t.Fatal(err)
		}
	}
	w.mu.Lock()
	w.ends[1].recvPostFails = true
	w.mu.Unlock()
	buf := make([]byte, 64)
	for _, m := range msgs {
		n, err := b.Recv(ctx, buf)
		if err != nil || string(buf[:n]) != m {
			t.Fatalf("recv %q %v, want %q", buf[:n], err, m)
		}
	}
	if _, err := b.Recv(ctx, buf); !errors.Is(err, ErrPeerGone) {
		t.Errorf("recv after the messages: %v, want ErrPeerGone (the failed repost)", err)
	}
}
