package cm

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/goxrc/goxrc/xrc/memfabric"
)

// TestMain fails the run if goroutines in cm's or xrc's code outlive every
// test: the sweep behind checkGoroutines, for the tests that do not take it
// (examples, unit tests without a fabric).
func TestMain(m *testing.M) {
	code := m.Run()
	if left := waitGoroutines(nil); len(left) > 0 {
		fmt.Fprintf(os.Stderr, "goroutine leak: %d left after every test:\n%s\n", len(left), strings.Join(left, "\n\n"))
		if code == 0 {
			code = 1
		}
	}
	os.Exit(code)
}

// newFabric is memfabric.New for a test that fails if goroutines it
// started outlive it (checkGoroutines).
func newFabric(t testing.TB) *memfabric.Fabric {
	checkGoroutines(t)
	return memfabric.New()
}

// checkGoroutines fails the test if goroutines in cm's or xrc's code that
// were not there when it was called outlive the test's cleanups (those
// registered after it run first, and close the listeners and connections).
func checkGoroutines(t testing.TB) {
	before := ourGoroutines()
	t.Cleanup(func() {
		if left := waitGoroutines(before); len(left) > 0 {
			t.Errorf("goroutine leak: %d left:\n%s", len(left), strings.Join(left, "\n\n"))
		}
	})
}

// waitGoroutines waits up to five seconds for the goroutines in cm's or
// xrc's code but those in before to end, and returns the stacks of those
// left. It waits only while some are left: an endpoint's goroutines end
// just after its Close, and the net.Conn adapter's Close leaves the release
// (the CM's time-wait, under the connection's timeout) to a goroutine. What
// cm keeps by design for seconds after a test (an idle device: its event
// pump and async readers, with its kept buffers and cached QPs) is closed
// at once (CloseIdleDevices) rather than left to its timer.
func waitGoroutines(before map[string]string) []string {
	deadline := time.Now().Add(5 * time.Second)
	for {
		CloseIdleDevices()
		var left []string
		for id, g := range ourGoroutines() {
			if _, ok := before[id]; !ok {
				left = append(left, g)
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			slices.Sort(left)
			return left
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ourGoroutines returns the stacks, by goroutine id, of the goroutines but
// the caller's that run cm's or xrc's code: the library's, and those a test
// started.
func ourGoroutines() map[string]string {
	buf := make([]byte, 1<<16)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	gs := strings.Split(string(buf), "\n\n")
	m := map[string]string{}
	for _, g := range gs[1:] { // the first is the caller's
		if !strings.Contains(g, "goxrc/cm.") && !strings.Contains(g, "goxrc/xrc") {
			continue
		}
		id, _, _ := strings.Cut(strings.TrimPrefix(g, "goroutine "), " ")
		m[id] = g
	}
	return m
}
