package main

import (
	"strings"
	"testing"

	"github.com/goxrc/goxrc/internal/mainexec"
)

// An -addr whose host is empty or an unspecified IP (":7471", as net.Dial
// takes for the local system, "0.0.0.0:7471", "[::]:7471") names no peer:
// the dial refuses it, whatever the device ("cm: the unspecified address
// names no peer", ErrInvalid). check took it, so it failed at the dial,
// with exit status 1 as a failed run and after -cpuprofile's file was
// truncated; in xrc mode only at its turn, after the entries before it had
// been connected and echoed. It is refused with exit status 2, naming the
// entry, before anything; a host name is left to the dial's look-up.
func TestAddrUnspecifiedRefused(t *testing.T) {
	for args, bad := range map[string]string{
		"-addr :7471":                               `":7471"`,
		"-addr 0.0.0.0:7471":                        `"0.0.0.0:7471"`,
		"-mode latency -addr [::]:7471":             `"[::]:7471"`,
		"-mode connect -addr [::ffff:0.0.0.0]:1":    `"[::ffff:0.0.0.0]:1"`,
		"-raw -addr [::%eth0]:7471":                 `"[::%eth0]:7471"`,
		"-mode xrc -addr 10.0.0.1:7471,:7471":       `":7471"`,
		"-mode bandwidth -addr 10.0.0.1:7471":       "",
		"-mode xrc -addr 10.0.0.1:7471,host:7471":   "",
		"-mode echo -raw -addr [fe80::1%eth0]:7471": "",
	} {
		err := checkArgs(t, args)
		if bad == "" && err != nil || bad != "" && (err == nil || !strings.Contains(err.Error(), "-addr entry "+bad)) {
			t.Errorf("%s: check %v, want %s", args, err, map[bool]string{true: "it accepted", false: "the entry " + bad + " refused"}[bad == ""])
		}
	}
	mainexec.Child("client", main)
	mainexec.RefusalKeepsProfile(t, map[string]string{"-addr :7471": `-addr entry ":7471" names no peer`})
}
