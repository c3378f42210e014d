package xrc

import (
	"errors"
	"io"
	"testing"
	"time"
)

// A Send that waits for its turn (held a moment by a FIN's post or another
// Send) when the connection and its endpoint end says why the connection
// ended, as one that finds the turn free: the peer's FIN (ErrPeerClosed),
// the device's loss (ErrDeviceRemoved). It said ErrClosed, which cm takes
// for the application's Close, whenever the endpoint's end won the select
// against the connection's (cm's TestDeviceLostAfterFinReadsEOF failed 1
// run in 500 under -race). Each of the Sends below picks one of the two
// ready ends at random, so the old code fails this test every run but one
// in 2^32.
func TestSendWaitingForTurnSaysWhyItEnded(t *testing.T) {
	for _, tc := range []struct {
		name    string
		peerFIN bool
		want    error
	}{{"peer FIN then device lost", true, ErrPeerClosed}, {"device lost", false, ErrDeviceRemoved}} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			s, r := w.endpoint("10.0.82.1", 7000), w.endpoint("10.0.82.2", 7001)
			sc, rc := pair(t, s, r)
			roundTrip(t, sc, rc, []byte("up"))
			if tc.peerFIN {
				if err := rc.Close(); err != nil {
					t.Fatal(err)
				}
				if _, err := sc.Recv(ctxT(t, 5*time.Second), make([]byte, 8)); !errors.Is(err, io.EOF) {
					t.Fatalf("Recv after the peer's Close: %v, want io.EOF", err)
				}
				<-sc.done // our FIN answered: the turn is free
			}
			sc.turn <- struct{}{} // held, as by a FIN's post
			w.f.Node("10.0.82.1").FailDevice()
			<-sc.done
			<-s.ctx.Done()
			for i := range 32 {
				if err := sc.Send(ctxT(t, 5*time.Second), []byte("x")); !errors.Is(err, tc.want) {
					t.Fatalf("Send %d, waiting for the turn: %v, want %v", i, err, tc.want)
				}
			}
			<-sc.turn
			if err := sc.Send(ctxT(t, 5*time.Second), []byte("x")); !errors.Is(err, tc.want) {
				t.Fatalf("Send with the turn free: %v, want %v", err, tc.want)
			}
		})
	}
}
