package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/goxrc/goxrc/cm"
	"github.com/goxrc/goxrc/internal/mainexec"
)

// silent is a client that connects, sends nothing, and holds the
// connection until the server closes it.
func silent(ctx context.Context, c *cm.Conn) {
	c.Recv(ctx, make([]byte, 64))
}

// -idle closes a connection that has sent nothing for that long: what the
// user asked for, as a Ctrl-C asks for the shutdown. Such a connection was
// reported as failed ("error": "closed: nothing received for ...") and
// made the exit status 1. It is reported as closed by -idle ("idle": true
// with -json), with no error, and the exit status stays 0; a client that
// never sent its request is reported too. The clients hold their
// connections until the server closes them: -idle ends them, whenever.
func TestIdleCloseIsNoError(t *testing.T) {
	for _, tc := range []struct {
		name   string
		client func(context.Context, *cm.Conn)
		mode   string
	}{{"echoed", echoed, ""}, {"silent", silent, "?"}} { // echoed's request may come after -idle on a stalled host
		t.Run(tc.name, func(t *testing.T) {
			mainexec.Child("server", func() { onFabric(tc.client); main() })
			t.Setenv(dirEnv, t.TempDir())
			for _, asJSON := range []bool{false, true} {
				args := "-addr 10.7.0.1:7471 -count 1 -idle 200ms"
				if asJSON {
					args += " -json"
				}
				stdout, stderr, code := mainexec.Run(t, args)
				if code != 0 {
					t.Errorf("%s: exit status %d, stdout %q, stderr %q; want 0", args, code, stdout, stderr)
				}
				if !asJSON {
					if tc.mode != "" && !strings.Contains(stdout, " "+tc.mode+": ") || !strings.Contains(stdout, "(closed by the server's -idle: nothing received for 200ms)") {
						t.Errorf("%s: stdout %q, want the connection (%s) reported closed by -idle", args, stdout, tc.mode)
					}
					continue
				}
				var r map[string]any
				dec := json.NewDecoder(strings.NewReader(stdout))
				if err := dec.Decode(&r); err != nil || dec.More() {
					t.Fatalf("%s: stdout %q (%v), want one JSON report", args, stdout, err)
				}
				if _, hasErr := r["error"]; tc.mode != "" && r["mode"] != tc.mode || r["idle"] != true || hasErr {
					t.Errorf("%s: report %q, want the connection (%s) closed by -idle (\"idle\": true), no error", args, stdout, tc.mode)
				}
			}
		})
	}
}
