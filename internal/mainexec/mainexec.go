// Package mainexec runs an example program's main in a child process, for
// its tests: the test binary itself, started again and asked through the
// environment to run main with a command line, so that flags, exit status
// and output are what a user's command line gives.
//
// A test calls [Child] first, then [Run] (or [Refused], [RefusalKeepsProfile]):
//
//	func TestSomething(t *testing.T) {
//		mainexec.Child("client", main)
//		stdout, stderr, code := mainexec.Run(t, "-mode xrc -fabric -json")
//		...
//	}
package mainexec

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// argsEnv carries the child's command line.
const argsEnv = "GOXRC_MAIN_ARGS"

// Child, in the child process, runs main with the command line Run gave
// (name is the program's name, os.Args[0]) and exits 0 if main returns. In
// the test itself it returns at once.
func Child(name string, main func()) {
	args, ok := os.LookupEnv(argsEnv)
	if !ok {
		return
	}
	os.Args = append([]string{name}, strings.Fields(args)...)
	main()
	os.Exit(0)
}

// Run runs t's test again in a child process, whose Child runs main with
// args (split at spaces), and returns its output and exit status. It fails t
// if the child cannot be started or runs over a minute.
func Run(t *testing.T, args string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+regexp.QuoteMeta(t.Name())+"$")
	cmd.Env = append(os.Environ(), argsEnv+"="+args)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("%s: still running after a minute; stderr %q", args, errOut.String())
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatalf("%s: %v", args, err)
	}
	return out.String(), errOut.String(), code
}

// Refused checks that the command line args is refused: exit status 2, with
// want in what it says on stderr.
func Refused(t *testing.T, args, want string) {
	t.Helper()
	if _, stderr, code := Run(t, args); code != 2 || !strings.Contains(stderr, want) {
		t.Errorf("%s: exit status %d, stderr %q; want exit status 2, %s", args, code, stderr, want)
	}
}

// RefusalKeepsProfile checks that each command line of refused (mapped to
// what its refusal says), given -cpuprofile, is refused before the profile's
// file is created: a refused command line must not truncate an earlier
// run's profile.
func RefusalKeepsProfile(t *testing.T, refused map[string]string) {
	t.Helper()
	for args, why := range refused {
		prof := filepath.Join(t.TempDir(), "cpu.out")
		if err := os.WriteFile(prof, []byte("an earlier run's profile"), 0o600); err != nil {
			t.Fatal(err)
		}
		Refused(t, "-cpuprofile "+prof+" "+args, why)
		if b, _ := os.ReadFile(prof); string(b) != "an earlier run's profile" {
			t.Errorf("%s: refused, yet -cpuprofile's file was rewritten (%d bytes)", args, len(b))
		}
	}
}
