package main

import (
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// stopGate is a progress line's writer: its first line stays in Write
// until stopped closes (the caller of stop has gone on) or an hour of the
// bubble's time has passed (nothing else can move). A line that
// sees stopped closed came out after stop had returned.
type stopGate struct {
	entered, stopped chan struct{}
	lines            atomic.Int32
	late             atomic.Bool
}

func (g *stopGate) Write(b []byte) (int, error) {
	if g.lines.Add(1) == 1 {
		close(g.entered)
		select {
		case <-g.stopped:
			g.late.Store(true)
		case <-time.After(time.Hour):
		}
		return len(b), nil
	}
	select {
	case <-g.stopped:
		g.late.Store(true)
	default:
	}
	return len(b), nil
}

// stop let the progress printer run on: a line it was writing (or about
// to) came out after stop returned, among or after the run's result (the
// fabric demo's table on stderr with -json; the summary on a terminal).
// stop returns once the printer has.
func TestProgressStopWaitsForPrinter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		g := &stopGate{entered: make(chan struct{}), stopped: make(chan struct{})}
		p := newProgressTo(g, time.Second, "latency", 10)
		<-g.entered // a line is being written
		p.stop()
		close(g.stopped) // the run's result would be printed now
		synctest.Wait()
		if g.late.Load() {
			t.Fatal("a progress line was written after stop returned")
		}
	})
}
