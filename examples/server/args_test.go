package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// An argument that is not a flag ends flag parsing: the flags after it were
// dropped (server 10.0.0.1:7471 -count 1 listened on 0.0.0.0:7471, serving
// for ever). main refuses it with exit status 2 before listening; the test
// runs main in a child process (this test binary, asked by the environment).
func TestStrayArgumentRefused(t *testing.T) {
	if args, ok := os.LookupEnv("GOXRC_SERVER_ARGS"); ok {
		os.Args = append([]string{"server"}, strings.Fields(args)...)
		main()
		os.Exit(0)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestStrayArgumentRefused$")
	cmd.Env = append(os.Environ(), "GOXRC_SERVER_ARGS=10.0.0.1:7471 -count 1")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(stderr.String(), `unexpected argument "10.0.0.1:7471"`) {
		t.Fatalf("server 10.0.0.1:7471 -count 1: %v, stderr %q; want exit status 2, unexpected argument", err, stderr.String())
	}
}
