package main

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/goxrc/goxrc/cm"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// FuzzServe: a client's first message is untrusted. Whatever it is (then
// the client ends its side), serve neither panics nor hangs, and reads it
// as "echo", "sink N" (N a non-negative int) or an unknown mode, exactly.
func FuzzServe(f *testing.F) {
	for _, s := range []string{"echo", "sink 3", " sink  0 ", "sink -1", "sink 99999999999999999999", "sink", "", "\x00echo"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, msg []byte) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		fab := memfabric.New()
		dir := t.TempDir()
		srv, cli := fab.Node("10.7.0.1"), fab.Node("10.7.0.2")
		l, err := cm.Listen(ctx, "10.7.0.1:7471", cm.WithFabric(srv.Process()), cm.WithDomainPath(dir+"/s"))
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		c, err := cm.Dial(ctx, l.Addr().String(), cm.WithFabric(cli.Process()), cm.WithDomainPath(dir+"/c"))
		if err != nil {
			t.Fatal(err)
		}
		if len(msg) > c.MaxMessageSize() {
			msg = msg[:c.MaxMessageSize()]
		}
		if err := c.Send(ctx, msg); err != nil {
			t.Fatal(err)
		}
		closed := make(chan error, 1)
		go func() { closed <- c.Close() }()
		s, err := l.Accept(ctx)
		if err != nil {
			t.Fatal(err)
		}
		r := serve(ctx, s, false)
		<-closed
		want := "?"
		f := strings.Fields(string(msg))
		if len(f) == 1 && f[0] == "echo" {
			want = "echo"
		} else if len(f) == 2 && f[0] == "sink" {
			want = "sink"
			if n, err := strconv.Atoi(f[1]); err != nil || n < 0 {
				if !strings.Contains(r.Error, "bad sink count") {
					t.Fatalf("sink count %q: error %q", f[1], r.Error)
				}
			}
		}
		if r.Mode != want {
			t.Fatalf("%q served as %q, want %q (%s)", msg, r.Mode, want, r.Error)
		}
	})
}
