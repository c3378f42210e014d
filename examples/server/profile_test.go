package main

import (
	"testing"

	"github.com/goxrc/goxrc/internal/mainexec"
)

// server -xrc with an unspecified -addr (and no -device) is refused with
// exit status 2, but only after -cpuprofile had created its file: the
// refused command line truncated an earlier run's profile to nothing. The
// client refuses its flags before the profile (TestRefusalKeepsProfile
// there); the server now does too. The test runs main in a child process
// (this test binary, asked by the environment).
func TestRefusalKeepsProfile(t *testing.T) {
	mainexec.Child("server", main)
	mainexec.RefusalKeepsProfile(t, map[string]string{
		"-xrc":                      "an XRC listener serves one device",
		"-xrc -addr [::]:7471":      "an XRC listener serves one device",
		"-count -1":                 "must not be negative",
		"-raw -keepalive 1s":        "-keepalive has no effect with -raw",
		"-addr 0.0.0.0:7471 -xrc x": "unexpected argument",
		// cm's bounds, which Listen refused with exit status 1 after
		// the profile's file was created.
		"-size 0":          "-size 0: must be 64 to 1073741824 without -raw",
		"-raw -size 0":     "-size 0: must be 1 to 1073741824",
		"-size 1073741825": "-size 1073741825: must be 64 to 1073741824 without -raw",
		"-depth 1":         "-depth 1: must be 2 to 4000",
		"-depth 4001":      "-depth 4001: must be 2 to 4000",
		"-busypoll -1ms":   "must not be negative",
		// A malformed -addr, which Listen refused so too.
		"-addr 10.0.0.1":  `-addr "10.0.0.1" is not ip:port`,
		"-addr 10.0.0.1:": `-addr "10.0.0.1:" is not ip:port`,
		// A port Listen cannot read, which it refused so too.
		"-addr 10.0.0.1:x":       `-addr "10.0.0.1:x": bad port "x"`,
		"-addr 10.0.0.1:7471,x":  `-addr "10.0.0.1:7471,x": bad port "7471,x"`,
		"-addr [::1]:65536 -raw": `bad port "65536"`,
	})
}
