package harness

import (
	"errors"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// countingQemu is a fake qemu that counts its boots in $OUT/boots and
// waits, as a booting guest does, until it is killed, where the boot's
// number compares to 1 by cmp ("==": the first boot only, "!=": every later
// one); other boots end at once, before the command.
func countingQemu(cmp string) string {
	return `while [[ $# -gt 0 ]]; do
  case $1 in -pidfile) pidfile=$2; shift 2;; -append) append=$2; shift 2;; *) shift;; esac
done
echo $$ > "$pidfile"
for w in $append; do case $w in rxevm.out=*) OUT=${w#*=};; esac; done
n=$(($(cat "$OUT/boots" 2>/dev/null || echo 0) + 1)); echo $n > "$OUT/boots"
[[ $n ` + cmp + ` 1 ]] || exit 1
while :; do sleep 0.05; done`
}

// stopFakes are vmFakes' package manager and modules, and a qemu whose
// first boot never reaches the command (it waits, as a booting guest does,
// until it is killed) and whose later boots end at once, each boot counted
// in $OUT/boots.
var stopFakes = map[string]string{
	"dpkg-query":         vmFakes["dpkg-query"],
	"modprobe":           vmFakes["modprobe"],
	"qemu-system-x86_64": countingQemu("=="),
}

// TestVMRunStopsOnTerm: SIGTERM (CI's limit, sent to the whole job) to
// test/vm/rxe-vm.sh while its guest boots kills the guest and ends the run
// as one that did not complete (125). It must not take the killed boot for
// a failed one and boot again: that guest would run the whole command with
// no caller left to wait for it. Sent to its process group, the signal kills
// the script's sleep too, which set -e took for the script's failure: it
// ended with that sleep's status, 143.
func TestVMRunStopsOnTerm(t *testing.T) {
	needRootAnd(t, "test/vm/rxe-vm.sh", "bash", "flock", "timeout", "bc", "cpio", "gzip", "/bin/busybox", "/bin/sleep")
	t.Run("alone", func(t *testing.T) { vmRunStoppedByTerm(t, false) })
	t.Run("group", func(t *testing.T) { vmRunStoppedByTerm(t, true) })
}

// groupTermSleep is a sleep that, run by the leader of its process group
// once the file $TERM_AFTER exists, first sends SIGTERM to that group (CI's
// limit, come as the script sleeps), which kills it too.
const groupTermSleep = `read -r -a stat < /proc/$$/stat
[[ ${stat[4]} != "$PPID" || ! -e $TERM_AFTER ]] || kill -TERM 0
exec /bin/sleep "$@"`

// vmRunStoppedByTerm runs TestVMRunStopsOnTerm, its SIGTERM sent to the
// script alone, or if group to its process group as it sleeps, once the
// guest has counted its boot.
func vmRunStoppedByTerm(t *testing.T, group bool) {
	dir := t.TempDir()
	fakes := map[string]string{}
	maps.Copy(fakes, stopFakes)
	if group {
		fakes["sleep"] = groupTermSleep
	}
	bin, work, out := fakeCommands(t, dir, fakes), filepath.Join(dir, "work"), filepath.Join(dir, "out")
	kernel := map[string]string{}
	fakeKernel(kernel, work)
	writeFiles(t, kernel)
	cmd := exec.Command("bash", "../vm/rxe-vm.sh", "--no-rxe", "-q", "-t", "300", "-o", out, "true")
	cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "GOXRC_VM_WORK="+work, "TERM_AFTER="+filepath.Join(out, "boots"))
	var log strings.Builder
	cmd.Stdout, cmd.Stderr = &log, &log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: group}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{}) // closed when the run has ended, with its result in err
	var err error
	go func() { err = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
		}
	})

	// Until the guest has counted its boot (not its pid, which it writes first: a
	// guest killed in between, on a loaded machine, had booted "" times).
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if b, _ := os.ReadFile(filepath.Join(out, "boots")); len(b) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the guest did not boot")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !group { // (to the group, the fake sleep sends it)
		if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatalf("rxe-vm.sh did not end after SIGTERM:\n%s", log.String())
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 125 {
		t.Errorf("rxe-vm.sh: %v, want exit status 125 (the VM did not complete):\n%s", err, log.String())
	}
	if boots, _ := os.ReadFile(filepath.Join(out, "boots")); strings.TrimSpace(string(boots)) != "1" {
		t.Errorf("the guest booted %q times, want once: a run stopped by SIGTERM booted it again:\n%s", strings.TrimSpace(string(boots)), log.String())
	}
}

// betweenBootsFakes are stopFakes' package manager and modules, a qemu
// whose first boot ends at once, before the command (a failed boot), and
// whose later boots wait until they are killed, and an mv that sends
// $SIGNAL to test/vm/rxe-vm.sh as it keeps that boot's console: the signal
// lands between the two boots, when no qemu runs.
var betweenBootsFakes = map[string]string{
	"dpkg-query":         vmFakes["dpkg-query"],
	"modprobe":           vmFakes["modprobe"],
	"qemu-system-x86_64": countingQemu("!="),
	"mv": `[[ $1 != */console.log ]] || kill -"$SIGNAL" $PPID
exec /bin/mv "$@"`,
}

// TestVMRunStopsBetweenBoots: a signal to test/vm/rxe-vm.sh after a failed
// boot, before the next one, finds no qemu to kill. The trap's kill then
// failed, and set -e ended the script inside the trap, with status 1:
// SIGTERM must end it as a VM that did not complete (125), with no boot
// after it, and SIGINT by SIGINT (so that its caller stops too).
func TestVMRunStopsBetweenBoots(t *testing.T) {
	needRootAnd(t, "test/vm/rxe-vm.sh", "bash", "flock", "timeout", "bc", "cpio", "gzip", "/bin/busybox", "/bin/mv")
	for _, c := range []struct {
		signal string
		want   func(*exec.ExitError) bool
		what   string
	}{
		{"TERM", func(e *exec.ExitError) bool { return e.ExitCode() == 125 }, "exit status 125"},
		{"INT", func(e *exec.ExitError) bool {
			ws, ok := e.Sys().(syscall.WaitStatus)
			return ok && ws.Signaled() && ws.Signal() == syscall.SIGINT
		}, "killed by SIGINT"},
	} {
		t.Run(c.signal, func(t *testing.T) {
			dir := t.TempDir()
			bin, work, out := fakeCommands(t, dir, betweenBootsFakes), filepath.Join(dir, "work"), filepath.Join(dir, "out")
			kernel := map[string]string{}
			fakeKernel(kernel, work)
			writeFiles(t, kernel)
			cmd := exec.Command("bash", "../vm/rxe-vm.sh", "--no-rxe", "-q", "-t", "300", "-o", out, "true")
			cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "GOXRC_VM_WORK="+work, "SIGNAL="+c.signal)
			var log strings.Builder
			cmd.Stdout, cmd.Stderr = &log, &log
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			var err error
			select {
			case err = <-done:
			case <-time.After(time.Minute):
				// A second boot waits until it is killed; its qemu is in
				// timeout's process group, which the script's does not reach.
				if b, _ := os.ReadFile(filepath.Join(out, "qemu.pid")); len(b) > 0 {
					if pid, _ := strconv.Atoi(strings.TrimSpace(string(b))); pid > 0 {
						syscall.Kill(pid, syscall.SIGKILL)
					}
				}
				cmd.Process.Kill()
				t.Fatalf("rxe-vm.sh did not end after SIG%s between boots (booted again?):\n%s", c.signal, log.String())
			}
			var exit *exec.ExitError
			if !errors.As(err, &exit) || !c.want(exit) {
				t.Errorf("rxe-vm.sh: %v, want %s:\n%s", err, c.what, log.String())
			}
		})
	}
}

// TestVMRunStopsQemuStartedAsSignalCame: a signal that reaches
// test/vm/rxe-vm.sh as qemu starts, before the script has its pid (a DEBUG
// trap sends it there), must stop qemu too: SIGTERM ends the run as one that
// did not complete (125), SIGINT by SIGINT. Its traps were set only once it
// had that pid, and the signal ended the script at once, leaving qemu (in a
// process group of its own, under timeout) to run for the whole -t.
func TestVMRunStopsQemuStartedAsSignalCame(t *testing.T) {
	needRootAnd(t, "test/vm/rxe-vm.sh", "bash", "flock", "timeout", "bc", "cpio", "gzip", "/bin/busybox")
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			dir, bin, started, work, mark := guestScene(t)
			hook := filepath.Join(dir, "hook.sh")
			writeFiles(t, map[string]string{hook: `trap '[[ $BASH_COMMAND != "QPID=\$! TAILPID=" ]] || kill -$SIGNAL $$' DEBUG`})
			cmd := exec.Command("bash", "../vm/rxe-vm.sh", "--no-rxe", "-t", "300", "-o", filepath.Join(dir, "out"), "true")
			cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "GOXRC_VM_WORK="+work, "STARTED="+started,
				"BASH_ENV="+hook, "SIGNAL="+strconv.Itoa(int(sig)))
			done, log := startMarked(t, cmd, dir, mark)
			requireStoppedBy(t, cmd, done, sig, mark, log, nil)
		})
	}
}

// groupSignalDate is a date that, run by the leader of its process group
// for a boot's start time (+%s.%N), the first time only (the file $ONCE
// then exists), first sends $SIGNAL to that group (^C at a terminal, or
// CI's limit), which kills it too unless it ignores that signal.
const groupSignalDate = `read -r -a stat < /proc/$$/stat
if [[ ${stat[4]} == "$PPID" && $1 == +%s.%N && ! -e $ONCE ]]; then : > "$ONCE"; kill -"$SIGNAL" 0; fi
exec /bin/date "$@"`

// TestVMRunStopsOnGroupSignalAsItReadsTheTime: a signal to the process
// group of test/vm/rxe-vm.sh as the script reads the time its first boot
// starts at ends it as one that comes while it sleeps does: SIGINT (^C) by
// SIGINT, so that a calling script stops too, SIGTERM as a run that did not
// complete (125), with no guest left running. The signal killed that date
// too, and the traps set before the boot loop only noted it: set -e ended
// the script, for the date's status, with 130 or 143, which a caller takes
// for the command's (before those traps, ^C ended it by SIGINT).
func TestVMRunStopsOnGroupSignalAsItReadsTheTime(t *testing.T) {
	needRootAnd(t, "test/vm/rxe-vm.sh", "bash", "flock", "timeout", "bc", "cpio", "gzip", "/bin/busybox", "/bin/date")
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			dir, bin, started, work, mark := guestScene(t)
			if err := os.WriteFile(filepath.Join(bin, "date"), []byte("#!/bin/bash\n"+groupSignalDate+"\n"), 0o755); err != nil {
				t.Fatal(err)
			}
			once := filepath.Join(dir, "signal-sent")
			cmd := exec.Command("bash", "../vm/rxe-vm.sh", "--no-rxe", "-t", "300", "-o", filepath.Join(dir, "out"), "true")
			cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "GOXRC_VM_WORK="+work, "STARTED="+started,
				"ONCE="+once, "SIGNAL="+strconv.Itoa(int(sig)))
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
			done, log := startMarked(t, cmd, dir, mark)
			requireStoppedBy(t, cmd, done, sig, mark, log, func(err error) {
				if _, serr := os.Stat(once); serr != nil {
					t.Fatalf("no %v was sent (%v); rxe-vm.sh: %v\n%s", sig, serr, err, log())
				}
			})
		})
	}
}

// requireStoppedBy waits for test/vm/rxe-vm.sh (done, from startMarked) to
// end on sig, runs first (if not nil) on its error, and checks how it ended:
// SIGTERM as a run that did not complete (125), SIGINT by SIGINT (so that a
// calling script stops too); and that no marked guest is left.
func requireStoppedBy(t *testing.T, cmd *exec.Cmd, done <-chan error, sig syscall.Signal, mark string, log func() string, first func(error)) {
	t.Helper()
	var err error
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		t.Fatalf("rxe-vm.sh did not end after %v; left running:\n%s\n%s", sig, commands(marked(mark)), log())
	}
	if first != nil {
		first(err)
	}
	ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if sig == syscall.SIGTERM && (ws.Signaled() || ws.ExitStatus() != 125) {
		t.Errorf("rxe-vm.sh: %v, want exit status 125 (the VM did not complete)\n%s", err, log())
	} else if sig == syscall.SIGINT && !(ws.Signaled() && ws.Signal() == syscall.SIGINT) {
		t.Errorf("rxe-vm.sh: %v, want it killed by SIGINT (so that a caller stops too)\n%s", err, log())
	}
	// What qemu left (its sleep) may end just after the script.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		left := marked(mark)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("rxe-vm.sh has ended (%v), its qemu not:\n%s\n%s", err, commands(left), log())
		}
	}
}

// peerWaitSleep is a sleep that, run by test/vm/rxe-vm.sh as it waits for
// the other guest's socket (sleep 0.1), the first time only (the file $ONCE
// then exists), first sends $SIGNAL to the script, or with $GROUP set to its
// process group (which kills this sleep too, unless it ignores the signal).
const peerWaitSleep = `if [[ $1 == 0.1 && ! -e $ONCE ]]; then : > "$ONCE"; kill -"$SIGNAL" "${GROUP:-$PPID}"; fi
exec /bin/sleep "$@"`

// TestVMRunStopsAsItWaitsForThePeer: a signal to test/vm/rxe-vm.sh --nic
// connect:SOCK as it waits for the other guest to listen (rxe-pair.sh's
// guest B, before the guests boot) ends it as one that comes as its guest
// boots does: SIGTERM as a run that did not complete (125; rxe-pair.sh then
// exits with B's 125), SIGINT by SIGINT; with no guest left running. The
// wait had no trap: TERM killed the script (rxe-pair.sh said B exit 143 and
// exited so), and INT to the script alone was lost (bash takes a sleep that
// outlived it for one that handled it), the wait going on for its minute.
func TestVMRunStopsAsItWaitsForThePeer(t *testing.T) {
	needRootAnd(t, "test/vm/rxe-vm.sh", "bash", "flock", "timeout", "bc", "cpio", "gzip", "/bin/busybox", "/bin/sleep")
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		for _, group := range []bool{false, true} {
			t.Run(sig.String()+map[bool]string{false: "", true: "/group"}[group], func(t *testing.T) {
				dir, bin, started, work, mark := guestScene(t)
				writeFiles(t, map[string]string{filepath.Join(bin, "sleep"): "#!/bin/bash\n" + peerWaitSleep + "\n"})
				if err := os.Chmod(filepath.Join(bin, "sleep"), 0o755); err != nil {
					t.Fatal(err)
				}
				once := filepath.Join(dir, "signal-sent")
				cmd := exec.Command("bash", "../vm/rxe-vm.sh", "--no-rxe", "-t", "300", "-o", filepath.Join(dir, "out"),
					"--nic", "connect:"+filepath.Join(work, "wire.sock"), "--ip", "10.88.0.2/24", "true")
				cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "GOXRC_VM_WORK="+work, "STARTED="+started,
					"ONCE="+once, "SIGNAL="+strconv.Itoa(int(sig)))
				if group {
					cmd.Env = append(cmd.Env, "GROUP=0")
					cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
				}
				done, log := startMarked(t, cmd, dir, mark)
				requireStoppedBy(t, cmd, done, sig, mark, log, func(err error) {
					if _, serr := os.Stat(once); serr != nil {
						t.Fatalf("no %v was sent (%v); rxe-vm.sh: %v\n%s", sig, serr, err, log())
					}
				})
			})
		}
	}
}

// TestVMRunStopsSecondQemuStartedAsSignalCame: a signal that reaches
// test/vm/rxe-vm.sh as the qemu of its second boot starts (after a failed
// first boot), before the script has that qemu's pid, stops that qemu too,
// as on the first boot (TestVMRunStopsQemuStartedAsSignalCame). The
// pre-loop traps that only note a signal were set once, before the first
// boot: on the second, the first boot's INT trap was still in place, killed
// that boot's qemu (gone already) and ended the script by SIGINT, leaving
// the new qemu to run for the whole -t.
func TestVMRunStopsSecondQemuStartedAsSignalCame(t *testing.T) {
	needRootAnd(t, "test/vm/rxe-vm.sh", "bash", "flock", "timeout", "bc", "cpio", "gzip", "/bin/busybox")
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			dir, bin, _, work, mark := guestScene(t)
			// The first boot fails at once; the second waits until killed.
			if err := os.WriteFile(filepath.Join(bin, "qemu-system-x86_64"), []byte("#!/bin/bash\n"+countingQemu("!=")+"\n"), 0o755); err != nil {
				t.Fatal(err)
			}
			hook := filepath.Join(dir, "hook.sh")
			writeFiles(t, map[string]string{hook: `trap 'if [[ $BASH_COMMAND == "QPID=\$! TAILPID=" ]] && (( (qstarts = ${qstarts:-0} + 1) == 2 )); then kill -$SIGNAL $$; fi' DEBUG`})
			out := filepath.Join(dir, "out")
			cmd := exec.Command("bash", "../vm/rxe-vm.sh", "--no-rxe", "-q", "-t", "300", "-o", out, "true")
			cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "GOXRC_VM_WORK="+work,
				"BASH_ENV="+hook, "SIGNAL="+strconv.Itoa(int(sig)))
			done, log := startMarked(t, cmd, dir, mark)
			requireStoppedBy(t, cmd, done, sig, mark, log, func(err error) {
				if !strings.Contains(log(), "a failed boot): booting again") {
					t.Fatalf("no second boot (the signal comes as it starts); rxe-vm.sh: %v\n%s", err, log())
				}
			})
		})
	}
}
