package main

import (
	"strings"
	"testing"
)

// xrc mode without -fabric dials its -addr list in order: a malformed
// entry (a trailing comma, a port left out) failed only at its own dial,
// after the entries before it had been connected and echoed, and with exit
// status 1, as a server that failed. check refuses it before any dial,
// naming the entry.
func TestXRCAddrListChecked(t *testing.T) {
	for args, bad := range map[string]string{
		"-mode xrc -addr 10.0.0.1:7471,":                         `""`,
		"-mode xrc -addr 10.0.0.1:7471,,10.0.0.3:7471":           `""`,
		"-mode xrc -addr 10.0.0.1:7471,10.0.0.3":                 `"10.0.0.3"`,
		"-mode xrc -addr 10.0.0.1:7471,10.0.0.3:":                `"10.0.0.3:"`,
		"-mode xrc -addr 10.0.0.1:7471,10.0.0.3:7471":            "",
		"-mode xrc -addr 10.0.0.1:7471,[fd00::1]:7471,host:7471": "",
	} {
		err := checkArgs(t, args)
		if bad == "" && err != nil || bad != "" && (err == nil || !strings.Contains(err.Error(), bad)) {
			t.Errorf("%s: check %v, want %s", args, err, map[bool]string{true: "it accepted", false: "the entry " + bad + " refused"}[bad == ""])
		}
	}
}
