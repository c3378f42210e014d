package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// server -xrc with an unspecified -addr (and no -device) is refused with
// exit status 2, but only after -cpuprofile had created its file: the
// refused command line truncated an earlier run's profile to nothing. The
// client refuses its flags before the profile (TestRefusalKeepsProfile
// there); the server now does too. The test runs main in a child process
// (this test binary, asked by the environment).
func TestRefusalKeepsProfile(t *testing.T) {
	if args, ok := os.LookupEnv("GOXRC_SERVER_PROFILE_ARGS"); ok {
		os.Args = append([]string{"server"}, strings.Fields(args)...)
		main()
		os.Exit(0)
	}
	for args, why := range map[string]string{
		"-xrc":                      "an XRC listener serves one device",
		"-xrc -addr [::]:7471":      "an XRC listener serves one device",
		"-count -1":                 "must not be negative",
		"-raw -keepalive 1s":        "-keepalive has no effect with -raw",
		"-addr 0.0.0.0:7471 -xrc x": "unexpected argument",
	} {
		prof := filepath.Join(t.TempDir(), "cpu.out")
		if err := os.WriteFile(prof, []byte("an earlier run's profile"), 0o600); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestRefusalKeepsProfile$")
		cmd.Env = append(os.Environ(), "GOXRC_SERVER_PROFILE_ARGS=-cpuprofile "+prof+" "+args)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		cancel()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(stderr.String(), why) {
			t.Errorf("server %s: %v, stderr %q; want exit status 2, %s", args, err, stderr.String(), why)
		}
		if b, _ := os.ReadFile(prof); string(b) != "an earlier run's profile" {
			t.Errorf("server %s: refused, yet -cpuprofile's file was rewritten (%d bytes)", args, len(b))
		}
	}
}
