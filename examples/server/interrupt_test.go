package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/goxrc/goxrc/cm"
	"github.com/goxrc/goxrc/internal/mainexec"
)

// echoed is a client that asks for an echo, has one message echoed, says
// so on stderr and holds the connection open.
func echoed(ctx context.Context, c *cm.Conn) {
	buf := make([]byte, 64)
	err := c.Send(ctx, []byte("echo"))
	if err == nil {
		err = c.Send(ctx, []byte("x"))
	}
	if err == nil {
		_, err = c.Recv(ctx, buf)
	}
	fmt.Fprintln(os.Stderr, "test client: echoed", err)
	c.Recv(ctx, buf) // until the server closes
}

// Ctrl-C (or SIGTERM) ends the server, which closes the connections it serves: a
// shutdown the user asked for. Each such connection was reported as
// failed, "error": "recv ...: context canceled" (in the text output too),
// though the exit status was 0. It is reported as closed by the shutdown,
// with no error, and the exit status stays 0.
func TestInterruptIsNoError(t *testing.T) {
	mainexec.Child("server", func() { onFabric(echoed); main() })
	t.Setenv(dirEnv, t.TempDir())
	for asJSON, sig := range map[bool]os.Signal{true: os.Interrupt, false: syscall.SIGTERM} {
		args := "-addr 10.7.0.1:7471"
		if asJSON {
			args += " -json"
		}
		p := mainexec.Start(t, args)
		p.Await(t, "test client: echoed <nil>")
		p.Signal(t, sig)
		stdout, stderr, code := p.Wait(t)
		if code != 0 {
			t.Errorf("%s: exit status %d after Ctrl-C, want 0; stderr %q", args, code, stderr)
		}
		if !asJSON {
			if !strings.Contains(stdout, "echo: 1 messages, 1 bytes") || !strings.Contains(stdout, "(closed by the server's shutdown)") ||
				strings.Contains(stdout, "canceled") {
				t.Errorf("%s: stdout %q, want the connection reported closed by the shutdown", args, stdout)
			}
			continue
		}
		var r struct {
			Mode     string `json:"mode"`
			Messages int    `json:"messages"`
			Error    string `json:"error"`
			Shutdown bool   `json:"shutdown"`
		}
		dec := json.NewDecoder(strings.NewReader(stdout))
		if err := dec.Decode(&r); err != nil || dec.More() {
			t.Fatalf("%s: stdout %q (%v), want one JSON report", args, stdout, err)
		}
		if r.Mode != "echo" || r.Messages != 1 || r.Error != "" || !r.Shutdown {
			t.Errorf("%s: report %q, want an echo of 1 message, closed by the shutdown, no error", args, stdout)
		}
	}
}
