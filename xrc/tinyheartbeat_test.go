package xrc

import (
	"testing"
	"time"
)

// A Heartbeat of 1 ns is positive, so the endpoint takes it as it is (0 or
// less means the default), but the janitor's tick, half of it, was 0:
// time.NewTicker panicked on the janitor's goroutine and took the process
// down (at the latest as Close waits for that goroutine, which starts with
// the ticker). Such an endpoint now connects, exchanges a message each way
// and closes.
func TestTinyHeartbeatRuns(t *testing.T) {
	w := newWorld(t)
	a := w.endpoint("10.0.213.1", 7000, func(c *Config) { c.Heartbeat = time.Nanosecond })
	b := w.endpoint("10.0.213.2", 7000)
	ca, cb := pair(t, a, b)
	roundTrip(t, ca, cb, []byte("tick"))
	roundTrip(t, cb, ca, []byte("tock"))
	ca.Close()
	cb.Close()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
}
