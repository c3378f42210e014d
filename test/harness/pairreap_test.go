package harness

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestPairStopSignalsNoReapedGuest: SIGTERM to test/vm/rxe-pair.sh once
// guest A has ended (here at once; in TestTwoNodes once B had the host kill
// it, minutes before B ends) must stop B, and signal nothing else: A's pid,
// which bash reaped as A ended, may be another process's by then (pids wrap
// at pid_max, 32768 on many machines). The trap sent SIGTERM to $APID
// regardless. The test gives A's pid to a process of its own (through
// /proc/sys/kernel/ns_last_pid) before it sends the signal; a DEBUG trap
// writes A's pid to a file as the script starts B.
func TestPairStopSignalsNoReapedGuest(t *testing.T) {
	s := reapedAScene(t, "while :; do sleep 0.05; done")
	cmd, done, log, apid, mark := s.cmd, s.done, s.log, s.apid, s.mark
	other := takePid(t, apid)

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// Once B stops (the trap has signalled), the test's process ends.
	for deadline := time.Now().Add(time.Minute); !strings.Contains(log(), "[B] rxe-vm: the VM did not complete"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("B did not stop after SIGTERM:\n%s", log())
		}
	}
	other.Process.Kill()
	other.Wait()
	if ws, _ := other.ProcessState.Sys().(syscall.WaitStatus); ws.Signal() != syscall.SIGKILL {
		t.Errorf("the process that got A's pid %d after A had ended: %v, want killed by the test (SIGKILL)", apid, other.ProcessState)
	}
	var err error
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		t.Fatalf("rxe-pair.sh did not end after SIGTERM; left running:\n%s\n%s", commands(marked(mark)), log())
	}
	if want := "rxe-pair: A exit 0, B exit 125"; !strings.Contains(log(), want) {
		t.Errorf("no %q in its output (rxe-pair.sh: %v):\n%s", want, err, log())
	}
}

// TestPairTakesNoReapedPidForA: once guest A has ended on its own (bash
// reaped it) and B ends after it, test/vm/rxe-pair.sh has nothing of A's to
// stop or wait for. It asked kill -0 "$APID" whether A still ran: a process
// that had got A's pid meanwhile was taken for A, told to stop (b-done)
// and waited for, 30 s, as a hung A is.
func TestPairTakesNoReapedPidForA(t *testing.T) {
	s := reapedAScene(t, `until [[ -e $RELEASE ]]; do sleep 0.05; done
: > "${pidfile%/*}/.cmd-started"; echo 0 > "${pidfile%/*}/exit_code"`)
	done, log, apid, mark := s.done, s.log, s.apid, s.mark
	other := takePid(t, apid)
	if err := os.WriteFile(s.release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	err := awaitPair(t, done, mark, log)
	if want := "rxe-pair: A exit 0, B exit 0"; err != nil || !strings.Contains(log(), want) {
		t.Errorf("rxe-pair.sh: %v, want no error and %q in its output:\n%s", err, want, log())
	}
	if _, serr := os.Stat(filepath.Join(s.work, "pair", "sync", "b-done")); serr == nil {
		t.Errorf("rxe-pair.sh told A to stop after A had ended (pid %d, now another process's):\n%s", apid, log())
	}
	if perr := other.Process.Signal(syscall.Signal(0)); perr != nil {
		t.Errorf("the process that got A's pid %d: %v", apid, perr)
	}
}

// reapedA is a run of test/vm/rxe-pair.sh whose guest A has ended and been
// reaped (its pid, apid, is free) while B's qemu runs.
type reapedA struct {
	cmd     *exec.Cmd
	done    <-chan error
	log     func() string
	apid    int
	mark    string
	work    string // the pair dir is work/pair
	release string // a file B's qemu may wait for (RELEASE)
}

// reapedAScene starts test/vm/rxe-pair.sh with fake guests: A's qemu
// completes its command at once, B's runs bQemu (bash, with $pidfile)
// after it has noted its start. It returns once A has ended and been
// reaped and B's qemu runs; a DEBUG trap writes A's pid to a file as the
// script starts B.
func reapedAScene(t *testing.T, bQemu string) reapedA {
	t.Helper()
	needRootAnd(t, "test/vm/rxe-pair.sh", "bash", "flock", "timeout", "bc", "cpio", "gzip", "perl", "/bin/busybox", "/bin/sleep")
	if f, err := os.OpenFile(lastPid, os.O_WRONLY, 0); err != nil {
		t.Skipf("cannot set the next pid: %v", err)
	} else {
		f.Close()
	}
	dir, bin, started, work, mark := guestScene(t)
	writeFiles(t, map[string]string{filepath.Join(bin, "qemu-system-x86_64"): `#!/bin/bash
while [[ $# -gt 0 ]]; do
  case $1 in -pidfile) pidfile=$2; shift 2;; -netdev) netdev=$2; shift 2;; *) shift;; esac
done
echo $$ > "$pidfile"
if [[ $netdev == *server=on* ]]; then
  perl -MSocket -e 'socket(my $s, AF_UNIX, SOCK_STREAM, 0) or die "$!"; bind($s, pack_sockaddr_un($ARGV[0])) or die "$!"' "${netdev##*addr.path=}"
  : > "${pidfile%/*}/.cmd-started"; echo 0 > "${pidfile%/*}/exit_code"; exit 0
fi
echo $$ >> "$STARTED"
` + bQemu + "\n"})
	if err := os.Chmod(filepath.Join(bin, "qemu-system-x86_64"), 0o755); err != nil {
		t.Fatal(err)
	}
	hook, apidFile, release := filepath.Join(dir, "hook.sh"), filepath.Join(dir, "apid"), filepath.Join(dir, "release")
	writeFiles(t, map[string]string{hook: `trap '[[ $BASH_COMMAND != "BPID=\$!" ]] || echo "$APID" > "$APID_FILE"' DEBUG`})
	cmd := exec.Command("bash", "../vm/rxe-pair.sh", "-o", filepath.Join(work, "pair"), "--a", "true", "--b", "true")
	cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "GOXRC_VM_WORK="+work, "STARTED="+started,
		"BASH_ENV="+hook, "APID_FILE="+apidFile, "RELEASE="+release)
	done, log := startMarked(t, cmd, dir, mark)

	// Until A has ended (and been reaped: its pid is free) and B runs.
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		b, _ := os.ReadFile(apidFile)
		apid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
		s, _ := os.ReadFile(started)
		if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(apid))); apid > 0 && os.IsNotExist(err) && len(s) > 0 {
			return reapedA{cmd: cmd, done: done, log: log, apid: apid, mark: mark, work: work, release: release}
		}
		select {
		case err := <-done:
			t.Fatalf("rxe-pair.sh ended before B ran: %v\n%s", err, log())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("A did not end (pid %d), or B did not start:\n%s", apid, log())
		}
	}
}

// lastPid sets the pid the next process gets (less one).
const lastPid = "/proc/sys/kernel/ns_last_pid"

// takePid starts a process of the test's own with pid (which must be
// free), unless another process takes it first (the test is skipped then).
func takePid(t *testing.T, pid int) *exec.Cmd {
	t.Helper()
	var other *exec.Cmd
	for try := 0; other == nil; try++ {
		if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid))); err == nil || try == 20 {
			t.Skipf("could not give A's pid %d to a process of the test's (taken: %v)", pid, err == nil)
		}
		if err := os.WriteFile(lastPid, []byte(strconv.Itoa(pid-1)), 0); err != nil {
			t.Fatal(err)
		}
		c := exec.Command("/bin/sleep", "600")
		if err := c.Start(); err != nil {
			t.Fatal(err)
		}
		if c.Process.Pid == pid {
			other = c
		} else {
			c.Process.Kill()
			c.Wait()
		}
	}
	t.Cleanup(func() { other.Process.Kill() })
	return other
}
