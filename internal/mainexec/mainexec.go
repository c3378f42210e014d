// Package mainexec runs an example program's main in a child process, for
// its tests: the test binary itself, started again and asked through the
// environment to run main with a command line, so that flags, exit status
// and output are what a user's command line gives.
//
// A test calls [Child] first, then [Run] (or [Refused], [RefusalKeepsProfile],
// or [Start] for a child it talks to while it runs):
//
//	func TestSomething(t *testing.T) {
//		mainexec.Child("client", main)
//		stdout, stderr, code := mainexec.Run(t, "-mode xrc -fabric -json")
//		...
//	}
package mainexec

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
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
	return Start(t, args).Wait(t)
}

// Proc is a child process that Start left running.
type Proc struct {
	args   string
	cmd    *exec.Cmd
	ctx    context.Context
	cancel context.CancelFunc
	stdout bytes.Buffer
	pipe   *bufio.Reader // the child's stderr, read by Await and Wait
	stderr strings.Builder
}

// Start starts main in a child process as Run does and returns it running:
// Await waits for a line of its stderr (the sign that it is ready), Signal
// signals it, and Wait returns its output and exit status.
func Start(t *testing.T, args string) *Proc {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	p := &Proc{args: args, ctx: ctx, cancel: cancel}
	p.cmd = exec.CommandContext(ctx, os.Args[0], "-test.run=^"+regexp.QuoteMeta(t.Name())+"$")
	p.cmd.Env = append(os.Environ(), argsEnv+"="+args)
	p.cmd.Stdout = &p.stdout
	pipe, err := p.cmd.StderrPipe()
	if err == nil {
		err = p.cmd.Start()
	}
	if err != nil {
		cancel()
		t.Fatalf("%s: %v", args, err)
	}
	p.pipe = bufio.NewReader(pipe)
	t.Cleanup(cancel) // a test that failed before Wait leaves no child behind
	return p
}

// Await reads the child's stderr up to a line that holds want, and returns
// that line. It fails t if stderr ends first (the child exited, or ran over
// its minute).
func (p *Proc) Await(t *testing.T, want string) string {
	t.Helper()
	for {
		line, err := p.pipe.ReadString('\n')
		p.stderr.WriteString(line)
		if strings.Contains(line, want) {
			return line
		}
		if err != nil {
			t.Fatalf("%s: stderr ended (%v) with no line holding %q: %q", p.args, err, want, p.stderr.String())
		}
	}
}

// Signal sends sig to the child.
func (p *Proc) Signal(t *testing.T, sig os.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("%s: %v", p.args, err)
	}
}

// Wait waits for the child to exit and returns its output (all of its
// stderr, the lines Await read included) and exit status. It fails t if the
// child runs over a minute.
func (p *Proc) Wait(t *testing.T) (stdout, stderr string, code int) {
	t.Helper()
	defer p.cancel()
	rest, _ := io.ReadAll(p.pipe) // before Wait, which closes the pipe
	p.stderr.Write(rest)
	err := p.cmd.Wait()
	var exit *exec.ExitError
	switch {
	case p.ctx.Err() != nil:
		t.Fatalf("%s: still running after a minute; stderr %q", p.args, p.stderr.String())
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatalf("%s: %v", p.args, err)
	}
	return p.stdout.String(), p.stderr.String(), code
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
