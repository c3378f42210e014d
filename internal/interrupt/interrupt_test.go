package interrupt

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"testing"
	"time"
)

// childEnv marks the test binary run as the program under test.
const childEnv = "GOXRC_INTERRUPT_CHILD"

// A program whose shutdown hangs after the first Ctrl-C dies of the second.
func TestSecondInterruptKills(t *testing.T) {
	if os.Getenv(childEnv) == "1" {
		ctx, stop := Context()
		defer stop()
		fmt.Println("ready")
		<-ctx.Done()
		fmt.Println("shutting down")
		select {} // a shutdown that never ends
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestSecondInterruptKills$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	// The child must start with SIGINT's default handling. Run with
	// SIGINT ignored (a background job of a shell without job control),
	// this process would pass that on, and the child's Stop restores it:
	// the second SIGINT is ignored. Exec resets a caught signal to the
	// default. (Not only where signal.Ignored says so: it does not see the
	// ignoring an earlier Notify and Stop restored.)
	c := make(chan os.Signal, 1)
	signal.Notify(c, os.Interrupt)
	defer signal.Stop(c)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(out)
	for _, want := range []string{"ready", "shutting down"} {
		if want != "ready" {
			// The first signal, once the child listens for it.
			if err := cmd.Process.Signal(os.Interrupt); err != nil {
				t.Fatal(err)
			}
		}
		if !lines.Scan() || lines.Text() != want {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("child said %q (%v), want %q", lines.Text(), lines.Err(), want)
		}
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		t.Fatalf("child: %v, want it killed by SIGINT", err)
	}
	ws := ee.Sys().(syscall.WaitStatus)
	if ctx.Err() != nil || !ws.Signaled() || ws.Signal() != syscall.SIGINT {
		t.Fatalf("child: %v (context: %v), want it killed by the second SIGINT", err, ctx.Err())
	}
}
