package xrc

import (
	"context"
	"errors"
	"testing"
)

// A Send whose context has ended, waiting for its turn when the connection
// and its endpoint have ended too, says why the connection ended, as one
// that finds the turn free does (it looks at the connection first, and at
// the context only while it waits): the device's loss, ErrDeviceRemoved,
// which cm maps to ErrPeerGone. It said context.Canceled (a deadline's
// DeadlineExceeded: a timeout to cm) whenever select took the context's end
// over the connection's or the endpoint's, once in three; the 32 Sends
// below pass together once in 400000 runs of the old code.
func TestSendWaitingForTurnEndedContextSaysWhyConnEnded(t *testing.T) {
	w := newWorld(t)
	s, r := w.endpoint("10.0.85.1", 7000), w.endpoint("10.0.85.2", 7001)
	sc, rc := pair(t, s, r)
	roundTrip(t, sc, rc, []byte("up"))
	sc.turn <- struct{}{} // held, as by a FIN's post
	w.f.Node("10.0.85.1").FailDevice()
	<-sc.done
	<-s.ctx.Done()
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	for i := range 32 {
		if err := sc.Send(ended, []byte("x")); !errors.Is(err, ErrDeviceRemoved) {
			t.Fatalf("Send %d, waiting for the turn: %v, want ErrDeviceRemoved", i, err)
		}
	}
	<-sc.turn
	if err := sc.Send(ended, []byte("x")); !errors.Is(err, ErrDeviceRemoved) {
		t.Fatalf("Send with the turn free: %v, want ErrDeviceRemoved", err)
	}
}
