package harness

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
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
			written, out, err := reparseBench(t, c.files)
			if says := strings.Contains(string(written), "FAILED: ") && strings.Contains(string(written), c.wantOut); says != c.wantErr {
				t.Errorf("the doc says FAILED: ... %q: %v, want %v", c.wantOut, says, c.wantErr)
			}
			if (err != nil) != c.wantErr || !strings.Contains(string(out), c.wantOut) {
				t.Errorf("bench.sh: %v, want failure %v and %q in its output:\n%s", err, c.wantErr, c.wantOut, out)
			}
		})
	}
}

// reparseBench runs test/bench.sh over benchRun's outputs with files over
// them ("" removes one): see reparse.
func reparseBench(t *testing.T, over map[string]string) (doc string, out []byte, err error) {
	t.Helper()
	return reparse(t, "bench", "GOXRC_BENCH", benchRun, over, "GOXRC_BENCH_CONNS=100")
}

// reparse runs test/<script>.sh over a VM run's outputs (run's files, with
// over's over them; "" removes one), rewriting the doc from them
// (<env>_REPARSE, the doc at <env>_DOC) with fakes for the package manager
// and the VM's preparation, and returns the doc written and the script's
// output and error. It skips where the script cannot run, and fails the
// test where it wrote no doc.
func reparse(t *testing.T, script, env string, run, over map[string]string, extraEnv ...string) (doc string, out []byte, err error) {
	t.Helper()
	needRootAnd(t, "test/"+script+".sh", "bash", "flock", "bc", "cpio", "gzip", "/bin/busybox", "git")
	dir := t.TempDir()
	bin, work := fakeCommands(t, dir, benchFakes), filepath.Join(dir, "work")
	runDir := filepath.Join(work, script, "run", "vm")
	files := map[string]string{}
	for f, body := range run {
		files[filepath.Join(runDir, f)] = body
	}
	for f, body := range over {
		if body == "" {
			delete(files, filepath.Join(runDir, f))
		} else {
			files[filepath.Join(runDir, f)] = body
		}
	}
	fakeKernel(files, work)
	writeFiles(t, files)
	path := filepath.Join(dir, script+".md")
	cmd := exec.Command("bash", "../"+script+".sh")
	cmd.Env = append(append(os.Environ(), "PATH="+bin+":"+filepath.Join(runtime.GOROOT(), "bin")+":"+os.Getenv("PATH"),
		"GOXRC_VM_WORK="+work, "GOTOOLCHAIN=local", env+"_REPARSE="+filepath.Dir(runDir),
		env+"_DOC="+path), extraEnv...)
	out, err = cmd.CombinedOutput()
	written, readErr := os.ReadFile(path)
	if readErr != nil {
		t.Fatalf("no doc written (%v): %v\n%s", readErr, err, out)
	}
	return string(written), out, err
}

// cmtimeOut is rdma-core 44's cmtime client output (show_perf's format),
// each step's "us / conn" perConn, with lines put before the table (what
// it prints as it goes).
func cmtimeOut(perConn float64, lines ...string) string {
	s := strings.Join(append([]string{"creating id", "resolving address", "resolving route", "creating qp", "connecting"}, lines...), "\n") +
		"\ndisconnecting\ndestroying id\nstep              total ms     max ms     min us  us / conn\n"
	for _, step := range []string{"create id", "resolve addr", "resolve route", "create qp", "connect", "disconnect", "destroy"} {
		s += fmt.Sprintf("%-13s: %11.2f%11.2f%11.2f%11.2f\n", step, perConn/10, perConn/1000, perConn/2, perConn)
	}
	return s
}

// TestBenchDropsFailedCmtimeRun: cmtime's client goes on past a connection
// that failed (an error event, a call that failed), and its steps' times
// are still divided by every connection asked for: a rejected connection
// ends its connect step early and the run's figure drops. Such a run is no
// figure of N connections' setup (the Go client prints none for a run with
// a failed dial), so bench.sh leaves it out of the C median and of the
// connect step's.
func TestBenchDropsFailedCmtimeRun(t *testing.T) {
	for name, failed := range map[string]string{
		"rejected":     "event: RDMA_CM_EVENT_REJECTED, error: 28",
		"unreachable":  "event: RDMA_CM_EVENT_UNREACHABLE, error: -110",
		"route error":  "RDMA_CM_EVENT_ROUTE_ERROR, error: -110",
		"addr error":   "RDMA_CM_EVENT_ADDR_ERROR, error: -110",
		"connect call": "failure rconnecting: Cannot allocate memory",
		"qp":           "failure creating qp: Cannot allocate memory",
	} {
		t.Run(name, func(t *testing.T) {
			doc, out, err := reparseBench(t, map[string]string{
				"setup100.c.1": cmtimeOut(10),
				"setup100.c.2": cmtimeOut(1, failed),
			})
			if err != nil {
				t.Fatalf("bench.sh: %v\n%s", err, out)
			}
			lines := strings.Split(doc, "\n")
			// 5 steps of 10 us per connection in the whole run: 50.
			row := lines[slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "| setup N=100,") })]
			if want := "| setup N=100, us per connection (rounds: C 50.00 / Go 60.00 ) | 50.00 | 60.00 |"; !strings.HasPrefix(row, want) {
				t.Errorf("the setup row is not of the whole run alone:\n%s\nwant it to begin %q", row, want)
			}
			step := lines[slices.IndexFunc(lines, func(l string) bool { return strings.Contains(l, `"connect" step`) })]
			if want := `cmtime "connect" step 10.00 us/conn`; !strings.Contains(step, want) {
				t.Errorf("the connect step is not the whole run's:\n%s\nwant %q", step, want)
			}
		})
	}
}
