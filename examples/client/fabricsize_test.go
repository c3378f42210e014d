package main

import (
	"testing"

	"github.com/goxrc/goxrc/internal/mainexec"
)

// The fabric's connections are XRC, which carries messages of at most
// 1 MiB (the package documentation says "over the fabric, up to 1 MiB"),
// but check took any -size to 1 GiB: client -mode xrc -fabric -size
// 1073741824 set up its 32 connections, made and filled a 1 GiB message
// (9.5 s and 1 GiB of memory here) and only then failed the first send,
// "message too long", with exit status 1 and -cpuprofile's file
// truncated. A -size over 1 MiB with -fabric is refused up front (exit
// status 2), naming the flag; 1 MiB is taken, and so is a larger -size
// without -fabric, where an RC connection carries it.
func TestFabricSizeBound(t *testing.T) {
	mainexec.Child("client", main)
	for args, ok := range map[string]bool{
		"-mode xrc -fabric -size 1048577":    false,
		"-mode xrc -fabric -size 1073741824": false,
		"-mode xrc -fabric -size 1048576":    true,
		"-mode xrc -fabric -size 0":          true,
		"-mode xrc -size 1048577":            true,
		"-mode echo -size 1073741824":        true,
	} {
		err := checkArgs(t, args)
		if (err == nil) != ok {
			t.Errorf("%s: check %v", args, err)
		}
	}
	mainexec.RefusalKeepsProfile(t, map[string]string{
		"-mode xrc -fabric -nodes 1 -procs 1 -clients 1 -size 1048577": "-size 1048577: must be 0 to 1048576 with -fabric",
	})
}
