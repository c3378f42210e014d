package xrc

import (
	"fmt"
	"testing"
	"time"
)

// Messages taken below the credit threshold (half the window) must still go
// back to a sender that waits for them. a sends a window and one more, then
// reads; b reads one, then sends a window and one more, then reads the
// rest. As over TCP, a's last Send needs only the credit of b's read, after
// which a reads and b's sends go too. At a window of 4 or more b's read
// stayed below the threshold and was never returned: a waited for it, not
// reading, and b for a's reads, for ever (keepalives kept both alive).
func TestCreditTakenBelowThresholdGoesBack(t *testing.T) {
	creditBelowThreshold(t, func(*Config) {}, false)
}

// TestCreditTakenBelowThresholdGoesBackAtOnce: the same, with a heartbeat
// so long that the janitor never looks during the test. The credits went
// back only at its look, half a heartbeat to a heartbeat after b's read;
// the connection's own timer (armOwedLocked) returns them at once, as cm's
// persist timer does.
func TestCreditTakenBelowThresholdGoesBackAtOnce(t *testing.T) {
	creditBelowThreshold(t, func(c *Config) { c.Heartbeat = time.Hour }, false)
}

// TestCreditTakenBelowThresholdGoesBackByTheJanitor: the same with the
// connections' timers off, so that only the janitor's look returns them:
// the fallback where a timer's firing was missed.
func TestCreditTakenBelowThresholdGoesBackByTheJanitor(t *testing.T) {
	creditBelowThreshold(t, func(*Config) {}, true)
}

func creditBelowThreshold(t *testing.T, mod func(*Config), timerOff bool) {
	for _, window := range []int{2, 3, 8, 64} {
		t.Run(fmt.Sprint("window", window), func(t *testing.T) {
			w := newWorld(t)
			set := func(c *Config) { c.RecvWindow = window; mod(c) }
			a := w.endpoint("10.0.0.1", 7000, set)
			b := w.endpoint("10.0.0.2", 7000, set)
			for _, e := range []*Endpoint{a.Endpoint, b.Endpoint} {
				e.mu.Lock()
				e.owedOff = timerOff
				e.mu.Unlock()
			}
			ca, cb := pair(t, a, b)
			ctx := ctxT(t, 10*time.Second) // a hang guard, not a bound
			aDone := make(chan error, 1)
			go func() {
				if err := sendSeq(ctx, ca, 0, window+1); err != nil {
					aDone <- fmt.Errorf("a: %w", err)
					return
				}
				aDone <- recvSeq(ctx, ca, 0, window+1, nil)
			}()
			if err := recvSeq(ctx, cb, 0, 1, nil); err != nil {
				t.Fatal(err)
			}
			if err := sendSeq(ctx, cb, 0, window+1); err != nil {
				t.Fatalf("b: %v (a never got the credit of b's read: a %+v, b %+v)", err, a.Stats(), b.Stats())
			}
			if err := recvSeq(ctx, cb, 1, window+1, nil); err != nil {
				t.Fatal(err)
			}
			if err := <-aDone; err != nil {
				t.Fatal(err)
			}
		})
	}
}
