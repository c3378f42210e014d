package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/goxrc/goxrc/cm"
	"github.com/goxrc/goxrc/internal/mainexec"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// dirEnv gives the child process (mainexec) the test's temporary
// directory, for its XRC domains.
const dirEnv = "GOXRC_CLIENT_TEST_DIR"

// onFabric, in the child process, runs examples/server's echo mode (the
// mode request, then an echo of every message) on each of addrs of an
// in-memory fabric, and makes main dial there, from a node of its own,
// instead of on a device. With echoes >= 0, the server echoes that many
// messages and closes the connection once the next is in.
func onFabric(echoes int, addrs ...string) {
	fab := memfabric.New()
	dir := os.Getenv(dirEnv)
	ctx := context.Background()
	for _, a := range addrs {
		host, _, _ := net.SplitHostPort(a)
		l, err := cm.Listen(ctx, a, cm.WithFabric(fab.Node(host).Process()), cm.WithDomainPath(filepath.Join(dir, host)))
		if err != nil {
			panic(err)
		}
		go func() {
			for {
				c, err := l.Accept(ctx)
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					buf := make([]byte, c.MaxRecvSize())
					_, err := c.Recv(ctx, buf) // the mode request
					for i := 0; err == nil && i != echoes; i++ {
						var n int
						if n, err = c.Recv(ctx, buf); err == nil {
							err = c.Send(ctx, buf[:n])
						}
					}
					c.Recv(ctx, buf) // the next: its sender waits on its echo
				}()
			}
		}()
	}
	client := fab.Node("10.7.0.99").Process()
	dial = func(ctx context.Context, addr string, opts ...cm.Option) (*cm.Conn, error) {
		return cm.Dial(ctx, addr, append(opts, cm.WithFabric(client), cm.WithDomainPath(filepath.Join(dir, "client")))...)
	}
}

// The xrc mode without -fabric prints the transport each connection got
// ("10.7.0.1:7471: connected over XRC"; over RC, cm's log line says why),
// but its -json held only the mode, the address list, the size, the count
// and the time: a script asking which transport it got had to read the
// text on stderr. The JSON carries each connection in "conns", as the
// fabric demo's carries each node in "nodes": its address, its transport
// and, over RC, why. The run dials two servers on the in-memory fabric,
// which carries XRC.
func TestXRCModeJSONHasTransports(t *testing.T) {
	addrs := []string{"10.7.0.1:7471", "10.7.0.2:7471"}
	mainexec.Child("client", func() { onFabric(-1, addrs...); main() })
	t.Setenv(dirEnv, t.TempDir())
	args := "-mode xrc -addr " + strings.Join(addrs, ",") + " -progress 0"
	stdout, stderr, code := mainexec.Run(t, args)
	for _, a := range addrs {
		if code != 0 || !strings.Contains(stdout, a+": connected over XRC") {
			t.Fatalf("%s: exit status %d, stdout %q, stderr %q; want %s connected over XRC", args, code, stdout, stderr, a)
		}
	}
	stdout, stderr, code = mainexec.Run(t, args+" -json")
	var got struct {
		Count int `json:"count"`
		Conns []struct {
			Addr      string  `json:"addr"`
			Transport string  `json:"transport"`
			Reason    *string `json:"reason"`
		} `json:"conns"`
	}
	if err := json.Unmarshal([]byte(stdout), &got); err != nil || code != 0 {
		t.Fatalf("%s -json: exit status %d, stdout %q (%v), stderr %q", args, code, stdout, err, stderr)
	}
	if got.Count != len(addrs) || len(got.Conns) != len(addrs) {
		t.Fatalf("%s -json: %s, want %d connections in conns", args, stdout, len(addrs))
	}
	for i, c := range got.Conns {
		if c.Addr != addrs[i] || c.Transport != "XRC" || c.Reason != nil {
			t.Errorf("%s -json: conns[%d] %+v, want %s over XRC, no reason", args, i, c, addrs[i])
		}
	}
}

// Over RC (a device without XRC, or a peer with no XRC listener: not on
// the fabric, which carries XRC) the reason in "conns" is the one cm logs,
// read from the Dial's log as its lines go on to the text output.
func TestReasonHandler(t *testing.T) {
	var text strings.Builder
	var reason string
	log := slog.New(reasonHandler{slog.NewTextHandler(&text, nil), &reason})
	log.Debug("XRC refused by the peer's CM recently, using RC", "reason", "below the text's level")
	if reason != "" {
		t.Fatalf("reason %q from a record the text leaves out", reason)
	}
	// As cm/xrcprobe.go's noXRC logs it.
	log.Info("XRC unavailable, using RC", "device", "rxe0", "reason", "the device has no XRC (IBV_DEVICE_XRC unset)")
	if reason != "the device has no XRC (IBV_DEVICE_XRC unset)" || !strings.Contains(text.String(), `reason="the device has no XRC`) {
		t.Fatalf("reason %q, text %q", reason, text.String())
	}
}

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
