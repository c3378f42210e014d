package interrupt

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"testing"
)

// doneChildEnv marks the test binary run as the program of
// TestSignalOnceDoneKills.
const doneChildEnv = "GOXRC_INTERRUPT_DONE_CHILD"

// A signal that comes once the context has ended, however soon, kills: the
// default handling is back before anyone sees the context end. The child
// signals itself, on its own thread, as soon as it sees ctx end: the
// signal is handled before the call returns, so a child that goes on to
// print "survived" had it swallowed (the second Ctrl-C of a user, or of
// TestSecondInterruptKills, which then waits out its minute). Several
// children, as each is one try of a race.
func TestSignalOnceDoneKills(t *testing.T) {
	if os.Getenv(doneChildEnv) == "1" {
		runtime.LockOSThread()
		ctx, stop := Context()
		defer stop()
		syscall.Kill(os.Getpid(), syscall.SIGINT) // the first: caught
		<-ctx.Done()
		syscall.Tgkill(os.Getpid(), syscall.Gettid(), syscall.SIGINT)
		fmt.Println("survived")
		os.Exit(0)
	}
	// The children start with SIGINT's default handling, even where this
	// process runs with it ignored: exec resets a caught signal (see
	// TestSecondInterruptKills).
	c := make(chan os.Signal, 1)
	signal.Notify(c, os.Interrupt)
	defer signal.Stop(c)
	for i := range 20 {
		cmd := exec.Command(os.Args[0], "-test.run=^TestSignalOnceDoneKills$")
		cmd.Env = append(os.Environ(), doneChildEnv+"=1")
		out, err := cmd.Output()
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("child %d: %v, output %q: want it killed by the second SIGINT", i, err, strings.TrimSpace(string(out)))
		}
		if ws := ee.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != syscall.SIGINT {
			t.Fatalf("child %d: %v, output %q: want it killed by the second SIGINT", i, err, strings.TrimSpace(string(out)))
		}
	}
}
