package harness

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// benchFakes are the commands test/bench.sh's preparation calls that would
// install packages or load modules.
var benchFakes = map[string]string{
	"dpkg-query": `printf 'install ok installed'`,
	"modprobe":   `exit 0`,
}

// benchRun holds a measuring run's VM outputs, one round, every target row
// with data, as test/bench.sh's guest writes them; the Go part's files are
// added by each case.
var benchRun = map[string]string{
	"setup100.c.1": "create id       :  0  0  0  10.00\nresolve addr    :  0  0  0  10.00\nresolve route   :  0  0  0  10.00\n" +
		"create qp       :  0  0  0  10.00\nconnect         :  0  0  0  10.00\n",
	"setup100.go.1": `{"per_conn_us":60}`,
	"lat64.c.1":     " 64  1000  1.0  2.0  10.00  3.0  4.0  5.0  6.0\n",
	"lat64.go.1":    `{"median_us":11}`,
	"bw4096.c.1":    " 4096  2000  100.00  100.00  25600\n",
	"bw4096.go.1":   `{"mb_per_s":99}`,
	"bw65536.c.1":   " 65536  300  100.00  100.00  1600\n",
	"bw65536.go.1":  `{"mb_per_s":99}`,
	"kernel":        "6.1.0-47-amd64\n",
	"gobench.log":   "BenchmarkCMPingPong64-2   \t    1000\t     44615 ns/op\t       0 B/op\t       0 allocs/op\nPASS\n",
	"gobench.rc":    "0\n",
	"goallocs.log":  "=== RUN   TestCMSendRecvZeroAllocs\n--- PASS: TestCMSendRecvZeroAllocs (1.00s)\nPASS\n",
	"goallocs.rc":   "0\n",
	"../vm.date":    "2026-12-06 07:00 UTC\n",
	"../commit":     "0000000\n",
}

// TestBenchFailsWhenGoTestsFail: test/bench.sh runs the zero-allocation test
// and the Go benchmarks in the guest and keeps each one's exit status; one
// that failed (or did not run to the end) makes bench.sh fail too, as a VM
// run that failed does, rather than exit 0 over a table that looks whole.
// bench.sh rewrites the doc from a run's outputs (GOXRC_BENCH_REPARSE), with
// fakes for the package manager and the VM's preparation.
func TestBenchFailsWhenGoTestsFail(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("test/bench.sh runs as root only")
	}
	for _, name := range []string{"bash", "flock", "bc", "cpio", "gzip", "/bin/busybox", "git"} {
		if _, err := exec.LookPath(name); err != nil {
			t.Skipf("no %s on this machine", name)
		}
	}
	for _, c := range []struct {
		name    string
		files   map[string]string // over benchRun's; "" removes one
		wantErr bool
		wantOut string
	}{
		{"all passed", nil, false, "written to"},
		{"zero-allocation test failed", map[string]string{
			"goallocs.log": "=== RUN   TestCMSendRecvZeroAllocs\n    x_test.go:1: 3 allocations per message\n--- FAIL: TestCMSendRecvZeroAllocs (1.00s)\nFAIL\n",
			"goallocs.rc":  "1\n"}, true, "TestCMSendRecvZeroAllocs failed (exit 1"},
		{"zero-allocation test crashed", map[string]string{
			"goallocs.log": "=== RUN   TestCMSendRecvZeroAllocs\npanic: runtime error: invalid memory address\n",
			"goallocs.rc":  "2\n"}, true, "TestCMSendRecvZeroAllocs failed (exit 2"},
		{"benchmarks crashed", map[string]string{
			"gobench.log": "panic: runtime error: invalid memory address\n",
			"gobench.rc":  "2\n"}, true, "the Go benchmarks failed (exit 2"},
		{"the VM ended before the Go tests", map[string]string{
			"goallocs.log": "", "goallocs.rc": "", "gobench.log": "", "gobench.rc": ""}, true, "did not run"},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			bin, work := fakeCommands(t, dir, benchFakes), filepath.Join(dir, "work")
			run := filepath.Join(work, "bench", "run", "vm")
			files := map[string]string{}
			for f, body := range benchRun {
				files[filepath.Join(run, f)] = body
			}
			for f, body := range c.files {
				if body == "" {
					delete(files, filepath.Join(run, f))
				} else {
					files[filepath.Join(run, f)] = body
				}
			}
			fakeKernel(files, work)
			writeFiles(t, files)
			doc := filepath.Join(dir, "benchmarks.md")
			cmd := exec.Command("bash", "../bench.sh")
			cmd.Env = append(os.Environ(), "PATH="+bin+":"+filepath.Join(runtime.GOROOT(), "bin")+":"+os.Getenv("PATH"),
				"GOXRC_VM_WORK="+work, "GOTOOLCHAIN=local", "GOXRC_BENCH_REPARSE="+filepath.Dir(run),
				"GOXRC_BENCH_DOC="+doc, "GOXRC_BENCH_CONNS=100")
			out, err := cmd.CombinedOutput()
			written, readErr := os.ReadFile(doc)
			if readErr != nil {
				t.Fatalf("no doc written (%v): %v\n%s", readErr, err, out)
			}
			if says := strings.Contains(string(written), "FAILED: ") && strings.Contains(string(written), c.wantOut); says != c.wantErr {
				t.Errorf("the doc says FAILED: ... %q: %v, want %v", c.wantOut, says, c.wantErr)
			}
			if (err != nil) != c.wantErr || !strings.Contains(string(out), c.wantOut) {
				t.Errorf("bench.sh: %v, want failure %v and %q in its output:\n%s", err, c.wantErr, c.wantOut, out)
			}
		})
	}
}
