package main

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/goxrc/goxrc/cm"
	"github.com/goxrc/goxrc/internal/mainexec"
)

// Without -raw a client's mode request ("echo", "sink N": up to 24 bytes)
// and the sink's report ("N BYTES": up to 39) are messages, bounded by the
// server's -size as any other (on RC each side sends at most the smaller
// of the two sizes). A -size below 64 was taken, and runs of the client
// then failed: against -size 8 a default bandwidth run (-size 8, -count
// 1000) could not send "sink 1000" (9 bytes, limit 8), and against
// -size 16 a run of 10^7 messages was streamed whole before the report
// ("10000000 160000000", 18 bytes) failed. Such a -size is refused with
// exit status 2 before listening; -raw (no requests, no reports: what
// rdma-core's examples send) keeps 1 byte up, and 64 is taken. The child's
// listen fails on purpose, the sign that main got that far.
func TestFramedSizeFloor(t *testing.T) {
	mainexec.Child("server", func() {
		listen = func(context.Context, string, ...cm.Option) (*cm.Listener, error) {
			return nil, errors.New("test: listen reached")
		}
		main()
	})
	for _, args := range []string{"-size 8", "-size 16 -count 1", "-size 63 -xrc -addr 10.0.0.1:7471"} {
		mainexec.Refused(t, args, "must be 64 to 1073741824 without -raw")
	}
	for _, args := range []string{"-size 64", "-raw -size 1", "-raw -size 16 -count 1"} {
		if _, stderr, code := mainexec.Run(t, args); code != 1 || !strings.Contains(stderr, "test: listen reached") {
			t.Errorf("%s: exit status %d, stderr %q; want it taken (the test's listen fails)", args, code, stderr)
		}
	}
	mainexec.RefusalKeepsProfile(t, map[string]string{"-size 8": "-size 8: must be 64"})
}
