package harness

import (
	"strings"
	"testing"
)

// benchXRCRun holds a measuring run of test/bench-xrc.sh, one round, every
// run in the guest passed (rc=0), as its guest writes them.
var benchXRCRun = map[string]string{
	"logical.1":      "BenchmarkHybridAddLogicalConn-2   50   4700000 ns/op\nPASS\nrc=0\n",
	"rc.1":           "BenchmarkRCDial-2   15   24300000 ns/op\nPASS\nrc=0\n",
	"logical-idle.1": "BenchmarkHybridAddLogicalConn-2   8   9000000 ns/op\nPASS\nrc=0\n",
	"rc-idle.1":      "BenchmarkRCDial-2   8   27000000 ns/op\nPASS\nrc=0\n",
	"sidr.1":         "BenchmarkHybridSIDRExchange-2   50   2000000 ns/op\nPASS\nrc=0\n",
	"floor.1":        `{"c_median_us":900,"go_median_us":1000,"resolve_us":500}` + "\nrc=0\n",
	"floor-idle.1":   `{"c_median_us":5000,"go_median_us":6000}` + "\nrc=0\n",
	"kernel":         "6.1.0-47-amd64\n",
	"../vm.rc":       "0\n",
	"../vm.date":     "2026-12-06 07:00 UTC\n",
	"../commit":      "0000000\n",
}

// TestBenchXRCFailsWhenARunFails: test/bench-xrc.sh's guest runs each
// benchmark in a round as its own process and keeps its exit status (rc=);
// the guest script goes on past one that failed, so the VM run passes. A
// failed run must fail bench-xrc.sh too, rather than let it exit 0 over a
// table whose medians left that round out (or that has no data). The doc
// is rewritten from a run's outputs (GOXRC_XRC_BENCH_REPARSE), with fakes
// for the package manager and the VM's preparation.
func TestBenchXRCFailsWhenARunFails(t *testing.T) {
	for _, c := range []struct {
		name    string
		files   map[string]string // over benchXRCRun's
		wantErr bool
		wantOut string // in its output
	}{
		{"all passed", nil, false, "written to"},
		{"RC dial failed", map[string]string{
			"rc.1": "--- FAIL: BenchmarkRCDial\n    bench_test.go:1: dial: timed out\nFAIL\nrc=1\n"}, true, "): rc.1 "},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, out, err := reparse(t, "bench-xrc", "GOXRC_XRC_BENCH", benchXRCRun, c.files)
			if (err != nil) != c.wantErr || !strings.Contains(string(out), c.wantOut) {
				t.Errorf("bench-xrc.sh: %v, want failure %v and %q in its output:\n%s", err, c.wantErr, c.wantOut, out)
			}
		})
	}
}
