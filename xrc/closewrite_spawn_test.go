package xrc

import (
	"errors"
	"testing"
	"time"
)

// A CloseWrite that finds its connection open, and whose FIN's goroutine
// then finds the endpoint stopped, says why the connection ended, as a
// CloseWrite called a moment later does (closeWriteErr): a device's loss,
// which failed the connection and closed the endpoint in between, is
// ErrDeviceRemoved. It said ErrClosed, which cm takes for the
// application's Close (still the answer where the application closed the
// endpoint). The test holds the endpoint's spawn lock across the window
// between CloseWrite's checks and its spawn, and lets the endpoint's Close
// run until it waits for that lock to stop the endpoint's goroutines; the
// test stops them for it (the assignment Close makes next), so that
// CloseWrite's spawn finds them stopped, as it does where Close takes the
// lock first.
func TestCloseWriteSpawnRefusedSaysWhyConnEnded(t *testing.T) {
	for _, tc := range []struct {
		name string
		want error
	}{{"device lost", ErrDeviceRemoved}, {"endpoint closed", ErrClosed}} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			s, r := w.endpoint("10.0.88.1", 7000), w.endpoint("10.0.88.2", 7001)
			sc, rc := pair(t, s, r)
			roundTrip(t, sc, rc, []byte("up"))
			s.spawnMu.Lock()
			held := true
			defer func() {
				if held {
					s.spawnMu.Unlock()
				}
			}()
			res := make(chan error, 1)
			go func() { res <- sc.CloseWrite() }()
			eventually(t, "CloseWrite past its checks", func() (bool, string) {
				s.mu.Lock()
				defer s.mu.Unlock()
				return sc.writeClosed, ""
			})
			ends := []<-chan struct{}{s.ctx.Done()} // Close waits for the spawn lock
			if tc.want == ErrDeviceRemoved {
				w.f.Node("10.0.88.1").FailDevice()
				ends = append(ends, sc.done)
			} else {
				go s.Close()
			}
			for _, ch := range ends {
				select {
				case <-ch:
				case <-time.After(5 * time.Second):
					t.Fatal("the connection or the endpoint did not end within 5s")
				}
			}
			s.spawnStopped = true // Close's next step
			held = false
			s.spawnMu.Unlock()
			var err error
			select {
			case err = <-res:
			case <-time.After(5 * time.Second):
				t.Fatal("CloseWrite never returned")
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("CloseWrite whose FIN's goroutine found the endpoint stopped: %v, want %v", err, tc.want)
			}
			if err := sc.CloseWrite(); !errors.Is(err, tc.want) {
				t.Fatalf("CloseWrite after: %v, want %v", err, tc.want)
			}
		})
	}
}
