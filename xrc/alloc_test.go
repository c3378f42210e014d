package xrc

import (
	"context"
	"fmt"
	"runtime"
	"testing"
)

// TestDataPathAllocations: once a connection is warm, Send and Recv take
// their buffers, completion channels and queue slots from what earlier
// messages gave back, and a credit return starts its goroutine without
// allocating, so the count per message stays well under one: what remains
// is the runtime's own now and then (a wait's bookkeeping, a map grown). At
// a window of 2 every message returns a credit, which allocated one
// closure per message until the goroutine's function was made once per
// connection. On the model, which takes its payload copies from the same
// free lists as the real kernel. It counts on one P, as testing.AllocsPerRun
// does: on more, the count follows the scheduler (how often a Send waits
// for a credit still on its way and wakes on a new channel, goroutines
// freed to one P's list and started from another's), up to 0.13 at -cpu 4
// on a loaded host (3 runs in 25 over 0.1; on one P at most 0.03).
func TestDataPathAllocations(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	for _, window := range []int{DefaultRecvWindow, 2} {
		t.Run(fmt.Sprintf("window-%d", window), func(t *testing.T) {
			w := newWorld(t)
			win := func(c *Config) { c.RecvWindow = window }
			a := w.endpoint("10.0.0.1", 7000, win)
			b := w.endpoint("10.0.0.2", 7000, win)
			ca, cb := pair(t, a, b)
			ctx := context.Background()
			msg, buf := make([]byte, 64), make([]byte, 64)
			roundTrip := func() {
				if err := ca.Send(ctx, msg); err != nil {
					t.Fatal(err)
				}
				if _, err := cb.Recv(ctx, buf); err != nil {
					t.Fatal(err)
				}
				if err := cb.Send(ctx, buf); err != nil {
					t.Fatal(err)
				}
				if _, err := ca.Recv(ctx, buf); err != nil {
					t.Fatal(err)
				}
			}
			for range 200 { // warm: queues and free lists at their working size
				roundTrip()
			}
			const rounds = 2000
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			for range rounds {
				roundTrip()
			}
			runtime.ReadMemStats(&after)
			perMsg := float64(after.Mallocs-before.Mallocs) / (2 * rounds)
			t.Logf("%.4f allocations per message (%d messages each way)", perMsg, rounds)
			if perMsg > 0.1 {
				t.Fatalf("%.4f allocations per message, want under 0.1", perMsg)
			}
		})
	}
}
