package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/goxrc/goxrc/cm"
	"github.com/goxrc/goxrc/internal/mainexec"
)

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
