package main

import (
	"strings"
	"testing"

	"github.com/goxrc/goxrc/internal/mainexec"
)

// check looked at -addr's form (host:port, a port given) but not at its
// port: "10.0.0.1:x", or a list given outside xrc mode ("10.0.0.1:7471,x",
// one address whose port is "7471,x"), passed and failed at the dial, with
// exit status 1 as a failed run and after -cpuprofile's file was
// truncated (in xrc mode, after the entries before it had been dialed).
// A port is what the dial takes, a number to 65535 or a service name; any
// other is refused with exit status 2, naming -addr and the port.
func TestAddrPortChecked(t *testing.T) {
	for args, bad := range map[string]string{
		"-addr 10.0.0.1:x":                               `"x"`,
		"-addr 10.0.0.1:7471,x":                          `"7471,x"`,
		"-mode connect -addr [fd00::1]:70000":            `"70000"`,
		"-mode bandwidth -addr host:-1":                  `"-1"`,
		"-mode xrc -addr 10.0.0.1:7471,10.0.0.2:x":       `"x"`,
		"-addr 10.0.0.1:7471":                            "",
		"-addr 10.0.0.1:65535":                           "",
		"-addr 10.0.0.1:http":                            "", // a service name, as the dial takes
		"-mode xrc -addr 10.0.0.1:7471,host:http":        "",
		"-mode echo -raw -addr [fd00::1%eth0]:7471":      "",
		"-mode xrc -fabric -procs 1 -clients 1 -nodes 1": "", // the default -addr, unused
	} {
		err := checkArgs(t, args)
		if bad == "" && err != nil || bad != "" && (err == nil || !strings.Contains(err.Error(), "-addr") || !strings.Contains(err.Error(), bad)) {
			t.Errorf("%s: check %v, want %s", args, err, map[bool]string{true: "it accepted", false: "the port " + bad + " refused"}[bad == ""])
		}
	}
	mainexec.Child("client", main)
	mainexec.RefusalKeepsProfile(t, map[string]string{
		"-addr 10.0.0.1:x":               `-addr entry "10.0.0.1:x": bad port "x"`,
		"-mode latency -addr 1.2.3.4:1,": `bad port "1,"`,
	})
}
