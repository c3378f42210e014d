package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"
)

// FuzzServe: a client's first message is untrusted. Whatever it is (then
// the client ends its side), serve neither panics nor hangs, and reads it
// as "echo", "sink N" (N a non-negative int64) or an unknown mode, exactly.
// The report counts nothing (only the request came), and its error is the
// one the request calls for: none for echo (the client ended cleanly),
// "ended after 0 of N" for a sink of N > 0, the mode's for an unknown one.
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
		want, wantErr, anyErr := "?", "unknown mode", false
		f := strings.Fields(string(msg))
		if len(f) == 1 && f[0] == "echo" {
			want, wantErr = "echo", ""
		} else if len(f) == 2 && f[0] == "sink" {
			want, wantErr = "sink", "bad sink count"
			if n, err := strconv.ParseInt(f[1], 10, 64); err == nil && n == 0 {
				anyErr = true // its report may or may not reach the client, which has gone
			} else if err == nil && n > 0 {
				wantErr = fmt.Sprintf("ended after 0 of %d messages", n)
			}
		}
		if r.Mode != want {
			t.Fatalf("%q served as %q, want %q (%s)", msg, r.Mode, want, r.Error)
		}
		if !anyErr && ((wantErr == "") != (r.Error == "") || !strings.Contains(r.Error, wantErr)) {
			t.Fatalf("%q served as %s with error %q, want %q", msg, r.Mode, r.Error, wantErr)
		}
		if r.Messages != 0 || r.Bytes != 0 {
			t.Fatalf("%q served as %s: %d messages, %d bytes counted after the request", msg, r.Mode, r.Messages, r.Bytes)
		}
	})
}
