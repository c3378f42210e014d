package xrc

import (
	"errors"
	"io"
	"testing"
	"time"
)

// A sender's last messages and FIN are in the receiver's SRQ, completed at
// the sender, when its INI's DISCONNECTED reaches the receiver first (the CM
// event and the receive queue are read by different goroutines; here the
// receive loop is held). The connection ends gracefully once the loop reads
// them: every message, then io.EOF, not ErrPeerGone.
func TestFINQueuedBehindDisconnectEndsGracefully(t *testing.T) {
	w := newWorld(t)
	g := &recvStall{}
	s := w.endpoint("10.0.94.1", 7000)
	r := w.wrappedEndpoint("10.0.94.2", 7001, g.wrap)
	sc, rc := pair(t, s, r)
	roundTrip(t, sc, rc, []byte("warm"))
	hold := make(chan struct{})
	g.set(hold) // the loop's next poll waits
	if err := sc.Send(ctxT(t, time.Second), []byte("m1")); err != nil {
		t.Fatal(err) // taken by the poll under way
	}
	if err := sc.Send(ctxT(t, time.Second), []byte("m2")); err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	go func() { closed <- sc.Close() }()
	// s's uplink to r's node has no leg left: its INI goes, and r's CM
	// reports DISCONNECTED on the physical link while m2 and the FIN wait
	// in the SRQ.
	eventually(t, "r saw the sender's INI go", func() (bool, string) {
		r.mu.Lock()
		defer r.mu.Unlock()
		return !rc.goneAt.IsZero(), "goneAt not set"
	})
	time.Sleep(3 * testHeartbeat) // janitor rounds with the FIN still unread
	g.set(nil)
	close(hold)
	buf := make([]byte, 16)
	for _, want := range []string{"m1", "m2"} {
		n, err := rc.Recv(ctxT(t, 5*time.Second), buf)
		if err != nil || string(buf[:n]) != want {
			t.Fatalf("Recv: %q, %v; want %q", buf[:n], err, want)
		}
	}
	if _, err := rc.Recv(ctxT(t, 5*time.Second), buf); !errors.Is(err, io.EOF) {
		t.Fatalf("after the last message: %v, want io.EOF", err)
	}
	rc.Close()
	if err := <-closed; err != nil {
		t.Fatalf("sender's Close: %v", err)
	}
}
