package harness

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestPairStopsGuestsOnGroupSignal: ^C, or SIGTERM (CI's limit), sent to
// the process group of test/vm/rxe-pair.sh run from a terminal stops both
// guests; and after ^C what each guest's rxe-vm.sh then says (the VM did not
// complete, and why) still reaches the terminal, prefixed [A] or [B]. The
// prefixing seds died of the signal, which the guests outlive (they ignore
// INT, started in the background, and stop on TERM), and each rxe-vm.sh died
// of SIGPIPE writing its next line: after ^C its last lines were lost, and
// on SIGTERM its qemu ran on, as bash's notice of its sleep killed by the
// signal came before its trap, which stops qemu.
func TestPairStopsGuestsOnGroupSignal(t *testing.T) {
	needRootAnd(t, "test/vm/rxe-pair.sh", "bash", "flock", "timeout", "bc", "cpio", "gzip", "perl", "/bin/busybox")
	t.Run("interrupt", func(t *testing.T) {
		out, ws := pairStoppedBy(t, syscall.SIGINT)
		if !ws.Signaled() || ws.Signal() != syscall.SIGINT {
			t.Errorf("rxe-pair.sh: exit status %d (signal %v), want it killed by SIGINT (so that a caller stops too)", ws.ExitStatus(), ws.Signal())
		}
		for _, g := range []string{"A", "B"} {
			if want := "[" + g + "] rxe-vm: the VM did not complete"; !strings.Contains(out, want) {
				t.Errorf("no %q in its output:\n%s", want, out)
			}
		}
	})
	// On SIGTERM it ends as rxe-vm.sh does, as a run that did not complete
	// (125), once the guests have (its last line says how they ended). Its
	// sleep, killed by the signal too, ended it at once with that sleep's
	// status, 143, as set -e took that for the script's failure.
	t.Run("terminated", func(t *testing.T) {
		out, ws := pairStoppedBy(t, syscall.SIGTERM)
		if ws.Signaled() || ws.ExitStatus() != 125 {
			t.Errorf("rxe-pair.sh: exit status %d (signal %v), want 125 (B did not complete)", ws.ExitStatus(), ws.Signal())
		}
		if want := "rxe-pair: A exit 125, B exit 125"; !strings.Contains(out, want) {
			t.Errorf("no %q in its output:\n%s", want, out)
		}
	})
}

// pairStoppedBy runs test/vm/rxe-pair.sh with guestFakes in a process group
// of its own, sends signal to that group once both guests run, checks that
// the script ends and that no guest runs on, and returns its output and how
// it ended.
func pairStoppedBy(t *testing.T, signal syscall.Signal) (string, syscall.WaitStatus) {
	t.Helper()
	dir, bin, started, work, mark := guestScene(t)
	cmd := exec.Command("bash", "../vm/rxe-pair.sh", "-o", filepath.Join(work, "pair"), "--a", "true", "--b", "true")
	cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "GOXRC_VM_WORK="+work, "STARTED="+started)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	done, log := startMarked(t, cmd, dir, mark)
	boots := func() int { b, _ := os.ReadFile(started); return strings.Count(string(b), "\n") }
	for deadline := time.Now().Add(2 * time.Minute); boots() < 2; time.Sleep(50 * time.Millisecond) {
		select {
		case err := <-done:
			t.Fatalf("rxe-pair.sh ended before its guests ran: %v\n%s", err, log())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the guests did not start:\n%s", log())
		}
	}
	if err := syscall.Kill(-cmd.Process.Pid, signal); err != nil {
		t.Fatal(err)
	}
	var err error
	select {
	case err = <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("rxe-pair.sh did not end after %v; left running:\n%s\n%s", signal, commands(marked(mark)), log())
	}
	// On SIGTERM the guests, which it reached too, may end after the script.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		left := marked(mark)
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rxe-pair.sh has ended (%v), its guests not:\n%s\n%s", err, commands(left), log())
		}
	}
	ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
	return log(), ws
}

// TestPairEndsAfterTermInItsLastWait: SIGTERM that reaches
// test/vm/rxe-pair.sh once its guests have completed, as it waits for what
// they printed (its last wait), finds nothing to stop: the script ends as
// it would have, with B's exit status and its last line. The signal cut
// that wait short, which set -e took for the script's failure: it ended
// with 143, saying nothing, possibly before the guests' last lines. A DEBUG
// trap sends the signal, once, as the script waits there.
func TestPairEndsAfterTermInItsLastWait(t *testing.T) {
	needRootAnd(t, "test/vm/rxe-pair.sh", "bash", "flock", "timeout", "bc", "cpio", "gzip", "perl", "/bin/busybox")
	dir, bin, started, work, mark := guestScene(t)
	hook := termInWait(t, dir, `wait`)
	cmd := exec.Command("bash", "../vm/rxe-pair.sh", "-o", filepath.Join(work, "pair"), "--a", "true", "--b", "true")
	cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "GOXRC_VM_WORK="+work, "STARTED="+started,
		"COMPLETES=1", "BASH_ENV="+hook)
	done, log := startMarked(t, cmd, dir, mark)
	err := awaitPair(t, done, mark, log)
	if err != nil {
		t.Errorf("rxe-pair.sh: %v, want exit status 0 (B's)", err)
	}
	if want := "rxe-pair: A exit 0, B exit 0"; !strings.Contains(log(), want) {
		t.Errorf("no %q in its output:\n%s", want, log())
	}
}

// TestPairSaysAsStatusAfterTermInItsWaitForA: SIGTERM that reaches
// test/vm/rxe-pair.sh as it waits for guest A's rxe-vm.sh (B done, A still
// running after it was told to end and its qemu's pid killed) stops A, and
// the script says A's exit status (125: its VM did not complete), not the
// wait's: the signal cut that wait short, and its status (143) was taken
// for A's. Here A's qemu runs on (its pid file names another process, which
// the host's kill hits), B's completes at once, the script's 0.1 s sleeps
// return at once (its 30 s for A pass at once), and a DEBUG trap sends the
// signal as the script waits for A.
func TestPairSaysAsStatusAfterTermInItsWaitForA(t *testing.T) {
	needRootAnd(t, "test/vm/rxe-pair.sh", "bash", "flock", "timeout", "bc", "cpio", "gzip", "perl", "/bin/busybox", "/bin/sleep")
	dir, bin, started, work, mark := guestScene(t)
	writeFiles(t, map[string]string{
		filepath.Join(bin, "qemu-system-x86_64"): `#!/bin/bash
while [[ $# -gt 0 ]]; do
  case $1 in -pidfile) pidfile=$2; shift 2;; -netdev) netdev=$2; shift 2;; *) shift;; esac
done
if [[ $netdev == *server=on* ]]; then
  perl -MSocket -e 'socket(my $s, AF_UNIX, SOCK_STREAM, 0) or die "$!"; bind($s, pack_sockaddr_un($ARGV[0])) or die "$!"' "${netdev##*addr.path=}"
  sleep 600 & echo $! > "$pidfile"
  while :; do sleep 0.05; done
fi
echo $$ > "$pidfile"; : > "${pidfile%/*}/.cmd-started"; echo 0 > "${pidfile%/*}/exit_code"
`,
		filepath.Join(bin, "sleep"): `#!/bin/sh
read -r cmd < /proc/$PPID/cmdline
case $cmd in *rxe-pair.sh*) exit 0;; esac
exec /bin/sleep "$@"
`,
	})
	for _, f := range []string{"qemu-system-x86_64", "sleep"} {
		if err := os.Chmod(filepath.Join(bin, f), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	hook := termInWait(t, dir, `wait "$APID"`)
	cmd := exec.Command("bash", "../vm/rxe-pair.sh", "-o", filepath.Join(work, "pair"), "--a", "true", "--b", "true")
	cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "GOXRC_VM_WORK="+work, "STARTED="+started, "BASH_ENV="+hook)
	done, log := startMarked(t, cmd, dir, mark)
	err := awaitPair(t, done, mark, log)
	if want := "rxe-pair: A exit 125, B exit 0"; !strings.Contains(log(), want) {
		t.Errorf("no %q in its output (rxe-pair.sh: %v):\n%s", want, err, log())
	}
	if ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus); ws.Signaled() || ws.ExitStatus() != 1 {
		t.Errorf("rxe-pair.sh: %v, want exit status 1 (A's failure)", err)
	}
}

// TestPairStopsOnGroupTermAsBWaitsForTheWire: SIGTERM (CI's limit) to the
// process group of test/vm/rxe-pair.sh while guest B's rxe-vm.sh waits for
// A's qemu to listen on the wire ends the run as one that did not complete:
// B's rxe-vm.sh exits 125, and so does the script, after its last line.
// That wait comes before rxe-vm.sh's traps: the signal killed it, and the
// script ended with B's 143. Here A's qemu starts and never listens, and a
// sleep of that wait sends the signal once A's qemu runs.
func TestPairStopsOnGroupTermAsBWaitsForTheWire(t *testing.T) {
	needRootAnd(t, "test/vm/rxe-pair.sh", "bash", "flock", "timeout", "bc", "cpio", "gzip", "perl", "/bin/busybox", "/bin/sleep")
	dir, bin, started, work, mark := guestScene(t)
	once := filepath.Join(dir, "term-sent")
	writeFiles(t, map[string]string{
		// A guest that never listens on the wire.
		filepath.Join(bin, "qemu-system-x86_64"): `#!/bin/bash
while [[ $# -gt 0 ]]; do case $1 in -pidfile) echo $$ > "$2"; shift 2;; *) shift;; esac; done
echo $$ >> "$STARTED"
while :; do /bin/sleep 0.05; done
`,
		// A sleep of B's wait for the wire, once A's qemu runs, sends SIGTERM to the group.
		filepath.Join(bin, "sleep"): `#!/bin/bash
if [[ $1 == 0.1 && -s $STARTED && ! -e $ONCE ]] && tr '\0' ' ' < /proc/$PPID/cmdline | grep -q -- '--nic connect:'; then
  : > "$ONCE"; kill -TERM 0
fi
exec /bin/sleep "$@"
`,
	})
	for _, f := range []string{"qemu-system-x86_64", "sleep"} {
		if err := os.Chmod(filepath.Join(bin, f), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("bash", "../vm/rxe-pair.sh", "-o", filepath.Join(work, "pair"), "--a", "true", "--b", "true")
	cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "GOXRC_VM_WORK="+work, "STARTED="+started, "ONCE="+once)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	done, log := startMarked(t, cmd, dir, mark)
	err := awaitPair(t, done, mark, log)
	if _, serr := os.Stat(once); serr != nil {
		t.Fatalf("no SIGTERM was sent as B waited for the wire (%v); rxe-pair.sh: %v\n%s", serr, err, log())
	}
	ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if ws.Signaled() || ws.ExitStatus() != 125 {
		t.Errorf("rxe-pair.sh: %v, want exit status 125 (B did not complete)\n%s", err, log())
	}
	if want := "rxe-pair: A exit 125, B exit 125"; !strings.Contains(log(), want) {
		t.Errorf("no %q in its output:\n%s", want, log())
	}
	for deadline := time.Now().Add(30 * time.Second); len(marked(mark)) > 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("rxe-pair.sh has ended (%v), its guests not:\n%s\n%s", err, commands(marked(mark)), log())
		}
	}
}

// termInWait writes a BASH_ENV hook that sends the script SIGTERM, once, as
// it waits (do_wait) in the command cmd, as $BASH_COMMAND shows it.
func termInWait(t *testing.T, dir, cmd string) string {
	t.Helper()
	hook := filepath.Join(dir, "hook.sh")
	writeFiles(t, map[string]string{hook: `trap '[[ $BASH_COMMAND != "` + strings.NewReplacer(`\`, `\\`, `"`, `\"`, `$`, `\$`).Replace(cmd) + `" ]] ||
  { trap - DEBUG; (until read -r w < /proc/$$/wchan; [[ $w == do_wait ]]; do :; done; kill -TERM $$) & }' DEBUG`})
	return hook
}

// awaitPair waits for rxe-pair.sh (started by startMarked) to end, and
// returns how it ended.
func awaitPair(t *testing.T, done <-chan error, mark string, log func() string) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(2 * time.Minute):
		t.Fatalf("rxe-pair.sh did not end; left running:\n%s\n%s", commands(marked(mark)), log())
		return nil
	}
}
