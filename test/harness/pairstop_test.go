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
	hook := filepath.Join(dir, "hook.sh")
	writeFiles(t, map[string]string{hook: `trap '[[ $BASH_COMMAND != wait ]] ||
  { trap - DEBUG; (until read -r w < /proc/$$/wchan; [[ $w == do_wait ]]; do :; done; kill -TERM $$) & }' DEBUG`})
	cmd := exec.Command("bash", "../vm/rxe-pair.sh", "-o", filepath.Join(work, "pair"), "--a", "true", "--b", "true")
	cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "GOXRC_VM_WORK="+work, "STARTED="+started,
		"COMPLETES=1", "BASH_ENV="+hook)
	done, log := startMarked(t, cmd, dir, mark)
	var err error
	select {
	case err = <-done:
	case <-time.After(2 * time.Minute):
		t.Fatalf("rxe-pair.sh did not end; left running:\n%s\n%s", commands(marked(mark)), log())
	}
	if err != nil {
		t.Errorf("rxe-pair.sh: %v, want exit status 0 (B's)", err)
	}
	if want := "rxe-pair: A exit 0, B exit 0"; !strings.Contains(log(), want) {
		t.Errorf("no %q in its output:\n%s", want, log())
	}
}
