package main

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/goxrc/goxrc/cm"
	"github.com/goxrc/goxrc/internal/mainexec"
)

// A -raw run sends one message and waits for one reply, but its progress
// line counted against -count's default, which -raw refuses: waiting on a
// peer that does not answer (a plain librdmacm server that sends nothing,
// such as cmtime -b; raw connections send no keepalive probes, so the
// wait is for ever), it said "echo: 0/1000 after 2s", every 2 s, of
// messages the run would never send. The line counts the run's one
// exchange, as its result does ("mode": "raw", "count": 1). The child's
// peer takes the message and answers nothing; the fabric has no raw
// messages, so the child dials it framed.
func TestRawProgressLine(t *testing.T) {
	mainexec.Child("client", func() {
		onFabric(0, "10.7.0.1:7471") // takes the first message as the mode request, then waits
		framed := dial
		dial = func(ctx context.Context, addr string, _ ...cm.Option) (*cm.Conn, error) { return framed(ctx, addr) }
		main()
	})
	t.Setenv(dirEnv, t.TempDir())
	p := mainexec.Start(t, "-addr 10.7.0.1:7471 -raw -progress 1ms")
	line := p.Await(t, " after ")
	p.Signal(t, os.Interrupt)
	_, stderr, code := p.Wait(t)
	if !strings.HasPrefix(line, "raw: 0/1 after ") {
		t.Errorf("progress line %q, want raw: 0/1 after ...", line)
	}
	if code != 1 || !strings.Contains(stderr, "client: interrupted") {
		t.Errorf("exit status %d, stderr %q; want 1, interrupted", code, stderr)
	}
}
