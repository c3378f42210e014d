package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

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

// cutShort is a client that asks for a sink of 5 messages, sends one and
// closes: a failed connection (the server's report: ended after 1 of 5).
func cutShort(ctx context.Context, c *cm.Conn) {
	c.Send(ctx, []byte("sink 5"))
	c.Send(ctx, []byte("x"))
	c.Close()
}

// A connection that failed (a sink cut short) at the moment of a Ctrl-C
// was no failure: the exit status said whether the context had ended when
// the connection's report came, not whether the shutdown ended it, and was
// 0. Only a connection the shutdown ends is let off; this one failed
// before it, and the exit status is 1. The child's serve is followed by a
// SIGINT, awaited, before serveConns sees the report.
func TestFailureAtInterruptFails(t *testing.T) {
	mainexec.Child("server", func() {
		onFabric(cutShort)
		serveConn = func(ctx context.Context, c *cm.Conn, raw bool, idle time.Duration) result {
			r := serve(ctx, c, raw, idle)
			syscall.Kill(os.Getpid(), syscall.SIGINT)
			<-ctx.Done()
			return r
		}
		main()
	})
	t.Setenv(dirEnv, t.TempDir())
	stdout, stderr, code := mainexec.Run(t, "-addr 10.7.0.1:7471 -json")
	var r result
	dec := json.NewDecoder(strings.NewReader(stdout))
	if err := dec.Decode(&r); err != nil || dec.More() {
		t.Fatalf("stdout %q (%v), want one JSON report; stderr %q", stdout, err, stderr)
	}
	if code != 1 || !strings.Contains(r.Error, "ended after 1 of 5") || r.Shutdown {
		t.Errorf("exit status %d, report %q: want 1, a sink that failed (ended after 1 of 5), not closed by the shutdown", code, stdout)
	}
}
