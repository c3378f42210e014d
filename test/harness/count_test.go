package harness

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// count runs test/lib.sh's count_verbose on log, with rc as the binary's
// exit status ("-" for none, as for the host's go test log).
func count(t *testing.T, log, rc string) string {
	t.Helper()
	f := filepath.Join(t.TempDir(), "log")
	if err := os.WriteFile(f, []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	script := `source ../lib.sh && count_verbose "$1"`
	args := []string{"-c", script, "bash", f}
	if rc != "-" {
		script = `source ../lib.sh && count_verbose "$1" "$2"`
		args = []string{"-c", script, "bash", f, rc}
	}
	out, err := exec.Command("bash", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("count_verbose: %v: %s", err, out)
	}
	return strings.TrimSpace(string(out))
}

func TestCountVerbose(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash on this machine: the harness is bash")
	}
	const pass = "=== RUN   TestA\n--- PASS: TestA (0.00s)\n=== RUN   TestB\n    --- SKIP: TestB/x (0.00s)\nPASS\n"
	for _, c := range []struct{ name, log, rc, want string }{
		{"passes and a skip", pass, "0", "1 0 1"},
		{"a failing test", "--- FAIL: TestA (0.00s)\nFAIL\n", "1", "0 1 0"},
		{"a crash without a failing test", "=== RUN   TestA\npanic: boom\n", "2", "0 1 0"},
		{"no exit status written", "=== RUN   TestA\nSIGSEGV: segmentation violation\n", "", "0 1 0"},
		{"a binary that ran no test", "testing: warning: no tests to run\nPASS\n", "0", "0 1 0"},
		{"a child's output logged with ChildOutput", pass + "    x_test.go:1: child:\n        | --- PASS: TestC (0.00s)\n", "0", "1 0 1"},
		{"a host package that failed to build", "FAIL\tgithub.com/x/y [build failed]\n", "-", "0 1 0"},
		{"host passes", "--- PASS: TestA (0.00s)\nok  \tgithub.com/x/y\t0.1s\n", "-", "1 0 0"},
	} {
		if got := count(t, c.log, c.rc); got != c.want {
			t.Errorf("%s: %q, want %q", c.name, got, c.want)
		}
	}
}
