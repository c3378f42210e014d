package harness

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// guestFakes are vmFakes' package manager and modules, a go whose builds
// and test binaries are empty scripts and whose checks and tests pass with
// no output, a gofmt that lists nothing, and a qemu that adds a line to
// $STARTED (its pid) and waits until it is
// killed, as a booting guest does; with $ONE_FAILS set, a guest of its own
// ends at once instead, unrecorded, before the command (a failed boot), so that the
// script goes on to its two-node run; with $COMPLETES set, every guest runs
// its command at once instead, which exits 0. The pair's listening guest
// makes the wire's socket, which the other's rxe-vm.sh waits for.
var guestFakes = map[string]string{
	"dpkg-query": vmFakes["dpkg-query"],
	"modprobe":   vmFakes["modprobe"],
	"gofmt":      `exit 0`,
	"go": `case $1 in
  env) case $2 in GOVERSION) echo go1.26.8;; GOROOT) dirname "$(dirname "$0")";; esac;;
  *) while [[ $# -gt 0 ]]; do [[ $1 != -o ]] || { printf '#!/bin/sh\n' > "$2" && chmod +x "$2"; }; shift; done;;
esac`,
	"qemu-system-x86_64": `while [[ $# -gt 0 ]]; do
  case $1 in -pidfile) pidfile=$2; shift 2;; -netdev) netdev=$2; shift 2;; *) shift;; esac
done
echo $$ > "$pidfile"
if [[ -z ${netdev:-} ]]; then
  [[ -z ${ONE_FAILS:-} ]] || exit 1
elif [[ $netdev == *server=on* ]]; then
  perl -MSocket -e 'socket(my $s, AF_UNIX, SOCK_STREAM, 0) or die "$!"; bind($s, pack_sockaddr_un($ARGV[0])) or die "$!"' "${netdev##*addr.path=}"
fi
echo $$ >> "$STARTED"
[[ -z ${COMPLETES:-} ]] || { : > "${pidfile%/*}/.cmd-started"; echo 0 > "${pidfile%/*}/exit_code"; exit 0; }
while :; do sleep 0.05; done`,
}

// marked returns the processes whose environment holds the entry mark.
func marked(mark string) []int {
	var pids []int
	dirs, _ := os.ReadDir("/proc")
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		env, _ := os.ReadFile(filepath.Join("/proc", d.Name(), "environ"))
		for _, e := range bytes.Split(env, []byte{0}) {
			if string(e) == mark {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// guestScene makes what a script that boots fake guests needs: a test
// directory dir with the fakes of guestFakes in bin, the file started (a
// line per boot), a short work directory (the pair's wire is a unix socket
// under it, of at most 108 bytes) holding a fake kernel, and the
// environment entry mark for startMarked.
func guestScene(t *testing.T) (dir, bin, started, work, mark string) {
	t.Helper()
	dir = t.TempDir()
	bin, started = fakeCommands(t, dir, guestFakes), filepath.Join(dir, "started")
	work, err := os.MkdirTemp("", "stop")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(work) })
	kernel := map[string]string{}
	fakeKernel(kernel, work)
	writeFiles(t, kernel)
	return dir, bin, started, work, "GOXRC_STOP_MARK=" + dir
}

// startMarked starts cmd with mark added to its environment (so that
// every process it starts carries it), its output in a file in dir (not a
// pipe, which a process left running would hold open, and with it
// cmd.Wait), and kills whatever carries mark once t ends (what a failed run
// left). It returns cmd's end and a reader of its output so far.
func startMarked(t *testing.T, cmd *exec.Cmd, dir, mark string) (<-chan error, func() string) {
	t.Helper()
	cmd.Env = append(cmd.Env, mark)
	logFile, err := os.Create(filepath.Join(dir, "log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { logFile.Close() })
	cmd.Stdout, cmd.Stderr = logFile, logFile
	t.Cleanup(func() {
		for _, pid := range marked(mark) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	return done, func() string { b, _ := os.ReadFile(logFile.Name()); return string(b) }
}

// commands names the processes pids, each by its command line.
func commands(pids []int) string {
	var s strings.Builder
	for _, pid := range pids {
		b, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
		s.WriteString(strconv.Itoa(pid) + ": " + strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " ")) + "\n")
	}
	return s.String()
}

// TestScriptsStopGuestsOnSignal: TERM or HUP sent to test/run-tests.sh or
// test/run-demo.sh alone (not to its process group: a supervisor's, CI's
// limit), or INT, to it alone or to its process group (^C), while a guest runs (test/vm/rxe-vm.sh, or the two of
// test/vm/rxe-pair.sh) stops the guests: none is left running, or booted
// again, once the script has ended, and it ends as that signal ends it
// (run-tests.sh's INT: exit 130). Bash died of TERM at once and left the
// guest's rxe-vm.sh running (which booted again once run-tests.sh's EXIT
// trap had killed the qemu of a booting guest), and ran its INT trap only
// once the guest had ended.
func TestScriptsStopGuestsOnSignal(t *testing.T) {
	needRootAnd(t, "test/run-tests.sh, as test/run-demo.sh,", "bash", "flock", "timeout", "bc", "cpio", "gzip", "perl", "/bin/busybox")
	for _, c := range []struct {
		script string
		pair   bool // signalled in the two-node run, the guest of its own having failed
		signal syscall.Signal
		group  bool // the signal sent to the script's process group (^C), not to it alone
		exit   int  // the script's exit status, or 0: killed by the signal
	}{
		{"run-tests", false, syscall.SIGTERM, false, 0},
		{"run-tests", false, syscall.SIGINT, false, 130},
		{"run-tests", false, syscall.SIGINT, true, 130},
		{"run-tests", true, syscall.SIGTERM, false, 0},
		{"run-demo", false, syscall.SIGHUP, false, 0},
		{"run-demo", true, syscall.SIGTERM, false, 0},
		{"run-demo", true, syscall.SIGINT, true, 0},
	} {
		name := c.script + "/" + map[bool]string{false: "one", true: "pair"}[c.pair] + "/" + c.signal.String() +
			map[bool]string{false: "", true: "/group"}[c.group]
		t.Run(name, func(t *testing.T) {
			dir, bin, started, work, mark := guestScene(t)
			cmd := exec.Command("bash", "../"+c.script+".sh")
			cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "GOXRC_VM_WORK="+work, "STARTED="+started)
			if c.pair {
				cmd.Env = append(cmd.Env, "ONE_FAILS=1")
			}
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: c.group}
			done, log := startMarked(t, cmd, dir, mark)

			want := 1 // guests running
			if c.pair {
				want = 2
			}
			boots := func() int { b, _ := os.ReadFile(started); return strings.Count(string(b), "\n") }
			for deadline := time.Now().Add(2 * time.Minute); boots() < want; time.Sleep(50 * time.Millisecond) {
				select {
				case err := <-done:
					t.Fatalf("%s.sh ended before its guests ran: %v\n%s", c.script, err, log())
				default:
				}
				if time.Now().After(deadline) {
					t.Fatalf("the guests did not start:\n%s", log())
				}
			}
			to := cmd.Process.Pid
			if c.group {
				to = -to
			}
			if err := syscall.Kill(to, c.signal); err != nil {
				t.Fatal(err)
			}
			var err error
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				t.Fatalf("%s.sh did not end after %v; left running:\n%s\n%s", c.script, c.signal, commands(marked(mark)), log())
			}
			var exit *exec.ExitError
			ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
			if c.exit == 0 && !(ws.Signaled() && ws.Signal() == c.signal) {
				t.Errorf("%s.sh: %v, want it killed by %v", c.script, err, c.signal)
			} else if c.exit != 0 && (!errors.As(err, &exit) || exit.ExitCode() != c.exit) {
				t.Errorf("%s.sh: %v, want exit status %d", c.script, err, c.exit)
			}
			for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
				left := marked(mark)
				if len(left) == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s.sh has ended, its guests not:\n%s\n%s", c.script, commands(left), log())
				}
			}
			if again := boots() - want; again != 0 {
				t.Errorf("%d guest(s) booted after %v:\n%s", again, c.signal, log())
			}
		})
	}
}
