package xrc

import (
	"errors"
	"io"
	"testing"
	"time"
)

// CloseWrite after the peer's CloseWrite: Recv's io.EOF there ends the
// peer's data only, and our side half-closes as ever (nil), its messages
// before its FIN delivered; only the peer's Close (a FIN not flagged half)
// makes CloseWrite return ErrPeerClosed, as Send does. The doc took Recv's
// io.EOF for the peer's Close ("After the peer's FIN (Recv's io.EOF) it
// returns ErrPeerClosed"), which holds for neither order of half-closes.
func TestCloseWriteAfterPeersHalfClose(t *testing.T) {
	w := newWorld(t)
	a, b := w.endpoint("10.0.0.1", 7001), w.endpoint("10.0.0.2", 7001)
	ctx := ctxT(t, 10*time.Second)
	buf := make([]byte, 16)

	ca, cb := pair(t, a, b)
	if err := ca.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if _, err := cb.Recv(ctx, buf); err != io.EOF {
		t.Fatalf("after the peer's CloseWrite: %v, want io.EOF", err)
	}
	if err := cb.Send(ctx, []byte("last")); err != nil {
		t.Fatalf("Send after the peer's CloseWrite: %v", err)
	}
	if err := cb.CloseWrite(); err != nil {
		t.Fatalf("CloseWrite after the peer's CloseWrite (Recv's io.EOF): %v, want nil", err)
	}
	if n, err := ca.Recv(ctx, buf); err != nil || string(buf[:n]) != "last" {
		t.Fatalf("message before the second half FIN: %q %v", buf[:n], err)
	}
	if _, err := ca.Recv(ctx, buf); err != io.EOF {
		t.Fatalf("after the second half FIN: %v, want io.EOF", err)
	}
	ca.Close()
	cb.Close()

	// The peer's Close: ErrPeerClosed, also after a CloseWrite of ours
	// that returned nil.
	ca, cb = pair(t, a, b)
	if err := cb.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	if err := ca.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := cb.Recv(ctx, buf); err != io.EOF {
		t.Fatalf("after the peer's Close: %v, want io.EOF", err)
	}
	if err := cb.CloseWrite(); !errors.Is(err, ErrPeerClosed) {
		t.Fatalf("CloseWrite after the peer's Close: %v, want ErrPeerClosed", err)
	}
	cb.Close()
}
