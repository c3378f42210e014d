package harness

import (
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// whileLocked runs test/apt.sh's while_locked on a fake command that fails
// with failMsg (exit status 100, as apt-get) on its first fails calls and
// then succeeds. It returns while_locked's exit status, how often the fake
// ran, and while_locked's stderr.
func whileLocked(t *testing.T, failMsg string, fails int, lockWait string) (rc, calls int, stderr string) {
	t.Helper()
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash on this machine: the harness is bash")
	}
	const script = `source ../apt.sh
n=0
fake() {
  n=$((n + 1))
  if ((n <= $2)); then echo "$1" >&2; return 100; fi
  echo "fake: done" >&2
}
LOCK_POLL=0.01 LOCK_WAIT=$3
while_locked fake "$1" "$2"
rc=$?
echo "rc=$rc calls=$n"`
	cmd := exec.Command("bash", "-c", script, "bash", failMsg, strconv.Itoa(fails), lockWait)
	var errb strings.Builder
	cmd.Stderr = &errb
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("bash: %v: %s", err, errb.String())
	}
	var got struct{ rc, calls int }
	if _, err := fmt.Sscanf(strings.TrimSpace(string(out)), "rc=%d calls=%d", &got.rc, &got.calls); err != nil {
		t.Fatalf("while_locked printed %q: %v", out, err)
	}
	return got.rc, got.calls, errb.String()
}

func TestWhileLocked(t *testing.T) {
	const (
		listsLock = "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 7 (apt-get)"
		dpkgLock  = "dpkg: error: dpkg frontend lock was locked by another process with pid 7"
		notFound  = "E: Unable to locate package nosuchpackage"
	)
	for _, c := range []struct {
		name      string
		msg       string
		fails     int
		lockWait  string
		wantRC    int
		wantCalls int // 0: more than one, however many fit in lockWait
		wantErr   string
	}{
		{"lists lock held twice, then free", listsLock, 2, "60", 0, 3, "fake: done"},
		{"dpkg's lock held once", dpkgLock, 1, "60", 0, 2, "waiting for another process"},
		{"another failure is not retried", notFound, 5, "60", 100, 1, notFound},
		// LOCK_WAIT 2, not 1: bash's SECONDS counts whole seconds, so
		// with 1 a second that ticked over during the first call ended
		// the wait after it (CI, once); 2 leaves at least one whole
		// second of retries.
		{"a lock held past LOCK_WAIT", listsLock, 1 << 30, "2", 100, 0, listsLock},
	} {
		t.Run(c.name, func(t *testing.T) {
			rc, calls, stderr := whileLocked(t, c.msg, c.fails, c.lockWait)
			if rc != c.wantRC {
				t.Errorf("exit status %d, want %d; stderr:\n%s", rc, c.wantRC, stderr)
			}
			if c.wantCalls != 0 && calls != c.wantCalls || c.wantCalls == 0 && calls < 2 {
				t.Errorf("the command ran %d times, want %d (0: more than once)", calls, c.wantCalls)
			}
			if !strings.Contains(stderr, c.wantErr) {
				t.Errorf("stderr lacks %q:\n%s", c.wantErr, stderr)
			}
		})
	}
}
