package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/goxrc/goxrc/cm"
	"github.com/goxrc/goxrc/internal/mainexec"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// dirEnv gives the child process (mainexec) the test's temporary
// directory, for its XRC domains.
const dirEnv = "GOXRC_SERVER_TEST_DIR"

// onFabric, in the child process, makes main listen on an in-memory fabric
// (on the node of -addr's host) and, once it listens, runs client on a
// connection to it from another node of the fabric.
func onFabric(client func(ctx context.Context, c *cm.Conn)) {
	fab := memfabric.New()
	dir := os.Getenv(dirEnv)
	listen = func(ctx context.Context, addr string, opts ...cm.Option) (*cm.Listener, error) {
		host, _, _ := net.SplitHostPort(addr)
		opts = append(opts, cm.WithFabric(fab.Node(host).Process()), cm.WithDomainPath(filepath.Join(dir, "server")))
		l, err := cm.Listen(ctx, addr, opts...)
		if err == nil {
			go func() {
				ctx := context.Background() // not main's, which Ctrl-C ends
				c, err := cm.Dial(ctx, l.Addr().String(), cm.WithFabric(fab.Node("10.7.0.99").Process()), cm.WithDomainPath(filepath.Join(dir, "client")))
				if err != nil {
					fmt.Fprintln(os.Stderr, "test client:", err)
					return
				}
				client(ctx, c)
			}()
		}
		return l, err
	}
}

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

// closed is a client that asks for an echo and closes.
func closed(ctx context.Context, c *cm.Conn) {
	c.Send(ctx, []byte("echo"))
	c.Close()
}

// With -json the server said nothing until a connection ended: no sign
// that it listened, nor where (-addr ip:0 picks a port). Its listening line
// goes to stderr, and stdout keeps the connections' reports only.
func TestJSONListeningLine(t *testing.T) {
	mainexec.Child("server", func() { onFabric(closed); main() })
	t.Setenv(dirEnv, t.TempDir())
	p := mainexec.Start(t, "-addr 10.7.0.1:0 -json -count 1")
	line := p.Await(t, "listening on 10.7.0.1:")
	stdout, stderr, code := p.Wait(t)
	if strings.HasPrefix(line, "listening on 10.7.0.1:0 ") || code != 0 {
		t.Errorf("listening line %q, exit status %d (stderr %q): want the port picked, exit status 0", line, code, stderr)
	}
	var r result
	dec := json.NewDecoder(strings.NewReader(stdout))
	if err := dec.Decode(&r); err != nil || dec.More() || r.Mode != "echo" || r.Error != "" {
		t.Errorf("stdout %q (%v): want one report, of a clean echo", stdout, err)
	}
}
