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
	})
}
