package main

import (
	"testing"

	"github.com/goxrc/goxrc/internal/mainexec"
)

// A -local that is not an IP address passed the checks and failed at the
// dial (cm.WithLocalAddr's ErrInvalid), with exit status 1 as a failed run
// and after -cpuprofile's file was truncated, as a malformed -addr did. It
// is refused with exit status 2, naming -local, before anything.
func TestLocalChecked(t *testing.T) {
	mainexec.Child("client", main)
	for args, ok := range map[string]bool{
		"-local garbage":                           false,
		"-mode connect -local 10.0.0.2:7471":       false,
		"-mode xrc -addr 10.0.0.1:7471 -local 10.": false,
		"-local 10.0.0.2":                          true,
		"-mode latency -local fe80::1%eth0":        false, // -addr's default is IPv4
		"-raw -local ::":                           true,
		// A literal of the other family has no route from -local: it
		// failed at the dial too. A name may have both families.
		"-addr [fe80::2%eth0]:7471 -local fe80::1%eth0":                true,
		"-addr [::ffff:10.0.0.1]:7471 -local 10.0.0.2":                 true,
		"-addr node1:7471 -local 10.0.0.2":                             true,
		"-addr [fd00::1]:7471 -local 10.0.0.2":                         false,
		"-mode xrc -addr 10.0.0.1:7471,[fd00::1]:7471 -local 10.0.0.2": false,
		"-addr [fd00::1]:7471 -local ::ffff:10.0.0.2":                  false,
	} {
		if err := checkArgs(t, args); (err == nil) != ok {
			t.Errorf("%s: check %v", args, err)
		}
	}
	mainexec.RefusalKeepsProfile(t, map[string]string{
		"-local garbage":                       `-local "garbage"`,
		"-addr [fd00::1]:7471 -local 10.0.0.2": "different IP families",
	})
}
