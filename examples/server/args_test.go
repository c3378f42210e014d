package main

import (
	"flag"
	"strings"
	"testing"

	"github.com/goxrc/goxrc/internal/mainexec"
)

// An argument that is not a flag ends flag parsing: the flags after it were
// dropped (server 10.0.0.1:7471 -count 1 listened on 0.0.0.0:7471, serving
// for ever). main refuses it with exit status 2 before listening; the test
// runs main in a child process (this test binary, asked by the environment).
func TestStrayArgumentRefused(t *testing.T) {
	mainexec.Child("server", main)
	mainexec.Refused(t, "10.0.0.1:7471 -count 1", `unexpected argument "10.0.0.1:7471"`)
}

// -keepalive and -xrc do nothing for raw connections (no probes; raw
// messages are plain sends on RC), and server -raw -keepalive 5s ran as if
// they were not given. main refuses them with exit status 2, naming the
// flag, before listening.
func TestIgnoredFlagRefused(t *testing.T) {
	mainexec.Child("server", main)
	for args, want := range map[string]string{
		"-raw -keepalive 5s":                 "-keepalive has no effect with -raw",
		"-keepalive 0 -raw -count 1":         "-keepalive has no effect with -raw",
		"-raw -xrc -addr 10.0.0.1:7471":      "-xrc has no effect with -raw",
		"-addr 10.0.0.1:7471 -xrc -raw=true": "-xrc has no effect with -raw",
	} {
		mainexec.Refused(t, args, want)
	}
}

// ignoredFlag lets through what a run uses: every flag without -raw, and
// with it those raw connections use (-raw=false is no raw run, and
// -xrc=false asks for no XRC, as the client takes -raw=false and
// -fabric=false).
func TestIgnoredFlagAccepts(t *testing.T) {
	for _, args := range []string{
		"-xrc -keepalive 5s -size 64 -idle 1s",
		"-raw -size 16 -depth 4 -idle 1s -count 1 -busypoll 0",
		"-raw=false -keepalive 5s -xrc",
		"-raw -xrc=false -count 1",
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
