package main

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"
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
		c, l := fabricPair(t, ctx)
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
		r := serve(ctx, s, false, 0)
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
