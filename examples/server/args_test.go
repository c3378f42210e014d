package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
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

// -keepalive and -xrc do nothing for raw connections (no probes; raw
// messages are plain sends on RC), and server -raw -keepalive 5s ran as if
// they were not given. main refuses them with exit status 2, naming the
// flag, before listening.
func TestIgnoredFlagRefused(t *testing.T) {
	if args, ok := os.LookupEnv("GOXRC_SERVER_IGNORED"); ok {
		os.Args = append([]string{"server"}, strings.Fields(args)...)
		main()
		os.Exit(0)
	}
	for args, want := range map[string]string{
		"-raw -keepalive 5s":                 "-keepalive has no effect with -raw",
		"-keepalive 0 -raw -count 1":         "-keepalive has no effect with -raw",
		"-raw -xrc -addr 10.0.0.1:7471":      "-xrc has no effect with -raw",
		"-addr 10.0.0.1:7471 -xrc -raw=true": "-xrc has no effect with -raw",
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestIgnoredFlagRefused$")
		cmd.Env = append(os.Environ(), "GOXRC_SERVER_IGNORED="+args)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err := cmd.Run()
		cancel()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(stderr.String(), want) {
			t.Errorf("server %s: %v, stderr %q; want exit status 2, %s", args, err, stderr.String(), want)
		}
	}
}

// ignoredFlag lets through what a run uses: every flag without -raw, and
// with it those raw connections use (-raw=false is no raw run).
func TestIgnoredFlagAccepts(t *testing.T) {
	for _, args := range []string{
		"-xrc -keepalive 5s -size 64 -idle 1s",
		"-raw -size 16 -depth 4 -idle 1s -count 1 -busypoll 0",
		"-raw=false -keepalive 5s -xrc",
		"",
	} {
		fs := flag.NewFlagSet("server", flag.ContinueOnError)
		raw := fs.Bool("raw", false, "")
		fs.Bool("xrc", false, "")
		fs.Duration("keepalive", 0, "")
		fs.Duration("idle", 0, "")
		fs.Duration("busypoll", 0, "")
		fs.Int("size", 0, "")
		fs.Int("depth", 0, "")
		fs.Int("count", 0, "")
		if err := fs.Parse(strings.Fields(args)); err != nil {
			t.Fatal(err)
		}
		if err := ignoredFlag(fs, *raw); err != nil {
			t.Errorf("%q: %v", args, err)
		}
	}
}
