package harness

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
)

// TestRunVMStopsCommandStartedAsSignalCame: a signal that reaches a script
// in test/lib.sh's run_vm after COMMAND has started, but before run_vm has
// its pid (a DEBUG trap sends it there), must stop COMMAND too. run_vm's
// trap found no pid to stop, and the script ended, leaving COMMAND (the
// guests) to run on with no caller.
func TestRunVMStopsCommandStartedAsSignalCame(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash on this machine")
	}
	dir := t.TempDir()
	mark := "GOXRC_STOP_MARK=" + dir // in every process the script starts
	script := `set -euo pipefail
source ../lib.sh
set -T
trap '[[ $BASH_COMMAND != "RUN_VM_PID=\$!" ]] || kill -TERM $$' DEBUG
run_vm sleep 600 || true
echo "run_vm returned"`
	cmd := exec.Command("bash", "-c", script)
	cmd.Env = append(os.Environ(), "GOXRC_VM_WORK="+filepath.Join(dir, "work"))
	done, log := startMarked(t, cmd, dir, mark)
	err := <-done
	out := log()
	if ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != syscall.SIGTERM {
		t.Errorf("the script: %v, want it killed by SIGTERM:\n%s", err, out)
	}
	// run_vm waits for COMMAND before the script takes the signal.
	if left := marked(mark); len(left) > 0 {
		t.Errorf("the script has ended, its command not:\n%s\n%s", commands(left), out)
	}
}
