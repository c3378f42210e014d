package main

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/goxrc/goxrc/internal/mainexec"
)

// A server that closed the connection in the middle of a run (it was
// stopped, or it ran with -count and -idle) ended the run with
// "client: EOF", naming neither the server nor how far the run got. The
// client names both, with exit status 1.
func TestServerClosedMidRun(t *testing.T) {
	mainexec.Child("client", func() {
		echoes, _ := strconv.Atoi(os.Getenv("GOXRC_TEST_ECHOES"))
		onFabric(echoes, "10.7.0.1:7471")
		main()
	})
	t.Setenv(dirEnv, t.TempDir())
	for _, tc := range []struct{ echoes, args, want string }{
		{"3", "-mode echo -count 10", "10.7.0.1:7471 closed the connection after 3 of 10 messages"},
		{"3", "-mode latency -warmup 1 -count 10", "10.7.0.1:7471 closed the connection after 2 of 10 messages"},
		{"0", "-mode xrc", "10.7.0.1:7471 closed the connection after 0 of 1 messages"},
	} {
		t.Setenv("GOXRC_TEST_ECHOES", tc.echoes)
		args, want := tc.args, tc.want
		_, stderr, code := mainexec.Run(t, "-addr 10.7.0.1:7471 -progress 0 "+args)
		if code != 1 || !strings.Contains(stderr, want) {
			t.Errorf("%s: exit status %d, stderr %q; want 1, %q", args, code, stderr, want)
		}
	}
}

// Ctrl-C in the middle of a run ended it with what it cut short:
// "client: recv 10.7.0.1:7471: context canceled". The client says it was
// interrupted, with exit status 1 (the run did not finish).
func TestInterruptSaysSo(t *testing.T) {
	mainexec.Child("client", func() { onFabric(-1, "10.7.0.1:7471"); main() })
	t.Setenv(dirEnv, t.TempDir())
	p := mainexec.Start(t, "-addr 10.7.0.1:7471 -mode echo -count 1000000000 -progress 1ms")
	p.Await(t, "echo: ") // a progress line: the run is under way
	p.Signal(t, os.Interrupt)
	_, stderr, code := p.Wait(t)
	if code != 1 || !strings.Contains(stderr, "client: interrupted: interrupt signal received") || strings.Contains(stderr, "canceled") {
		t.Errorf("exit status %d, stderr %q; want 1, client: interrupted", code, stderr)
	}
}
