package main

import (
	"flag"
	"strings"
	"testing"
)

// An argument that is not a flag ends flag parsing: the flags after it were
// dropped and the run went ahead (client -mode xrc -fabric extra -json
// printed its table, not JSON; client 10.0.0.1:7471 -mode latency dialed
// the default address in echo mode). It is refused, naming the argument.
func TestStrayArgumentRefused(t *testing.T) {
	for _, args := range []string{
		"-mode xrc -fabric extra -json",
		"10.0.0.1:7471 -mode latency",
		"-mode latency -- -count 5",
	} {
		_, _, err := parseFlags(flag.NewFlagSet("client", flag.ContinueOnError), strings.Fields(args))
		if err == nil || !strings.Contains(err.Error(), "unexpected argument") {
			t.Errorf("%s: %v, want unexpected argument", args, err)
		}
	}
}

// The fabric demo runs its servers in the program and dials none of -addr
// or -local: given with -fabric they were ignored without a word (client
// -mode xrc -fabric -addr 10.0.0.5:7471 ran, and said nothing of the server
// the user named). They are refused; without -fabric, -addr is the run.
func TestFabricRefusesAddr(t *testing.T) {
	for args, ok := range map[string]bool{
		"-mode xrc -fabric -addr 10.0.0.5:7471": false,
		"-mode xrc -fabric -addr garbage":       false,
		"-mode xrc -fabric -local 10.0.0.2":     false,
		"-mode xrc -addr 10.0.0.5:7471":         true,
		"-mode xrc -fabric":                     true,
	} {
		o, _, err := parseFlags(flag.NewFlagSet("client", flag.ContinueOnError), strings.Fields(args))
		if err != nil {
			t.Fatal(err)
		}
		if err := o.check(); (err == nil) != ok {
			t.Errorf("%s: check %v", args, err)
		}
	}
}
