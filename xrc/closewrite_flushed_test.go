package xrc

import (
	"errors"
	"io"
	"testing"
	"time"

	"github.com/goxrc/goxrc/xrc/memfabric"
)

// A half FIN posted behind a stalled INI (another process of the node
// paused, RNR retried for ever) for longer than HandshakeTimeout, then
// flushed by the recovery that follows that process's death: CloseWrite
// returned nil once the FIN was posted, and the engine's goroutine that
// waits for its completion gave up at the handshake timeout, so nothing
// posted the FIN again after the recovery. The live peer got every message
// but never io.EOF, and nothing told the application (CloseWrite again
// returned nil, Err nil): the half-close was lost. A posted FIN, as a
// posted data frame, is the engine's to deliver until the connection ends.
func TestCloseWriteFINFlushedAfterHandshakeTimeoutIsPostedAgain(t *testing.T) {
	w := newWorld(t)
	node := w.f.AddNode("10.0.123.2", memfabric.NodeConfig{SRQReceives: 4})
	s := w.endpoint("10.0.123.1", 7000, longTimers, func(c *Config) { c.HandshakeTimeout = 500 * time.Millisecond })
	a := w.endpoint("10.0.123.2", 7100, longTimers)
	b := w.endpoint("10.0.123.2", 7101, longTimers)
	toA, fromS := pair(t, s, a)
	toB, _ := pair(t, s, b)
	ctx := ctxT(t, 10*time.Second)
	b.p.PauseReceives()
	if err := sendSeq(ctx, toB, 0, 8); err != nil { // 4 land, the rest wait at s's INI
		t.Fatal(err)
	}
	if node.Stats().RNRNAKs == 0 {
		t.Fatal("no message to b waits at the INI: the test tests nothing")
	}
	if err := toA.Send(ctx, []byte("m")); err != nil { // behind b's, at the INI
		t.Fatal(err)
	}
	if err := toA.CloseWrite(); err != nil {
		t.Fatalf("CloseWrite with its FIN posted behind the stalled INI: %v", err)
	}
	time.Sleep(time.Second) // past s's handshake timeout, the FIN still waiting
	b.p.Kill()              // b's sends fail, the INI with them: the FIN is flushed
	if err := sendErr(t, toB); !errors.Is(err, ErrPeerGone) {
		t.Fatalf("the connection to the killed receiver: %v, want ErrPeerGone", err)
	}
	buf := make([]byte, 16)
	if n, err := fromS.Recv(ctx, buf); err != nil || string(buf[:n]) != "m" {
		t.Fatalf("Recv: %q, %v; want %q", buf[:n], err, "m")
	}
	short := ctxT(t, 3*time.Second)
	if _, err := fromS.Recv(short, buf); err != io.EOF {
		t.Fatalf("after the message, with the half FIN flushed by the recovery: %v, want io.EOF (CloseWrite again: %v, Err %v, sender %+v)",
			err, toA.CloseWrite(), toA.Err(), s.Stats())
	}
	roundTrip(t, fromS, toA, []byte("reply"))
}
