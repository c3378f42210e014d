package main

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// FuzzServe: a client's first message is untrusted. Whatever it is (then
// the client ends its side), serve neither panics nor hangs, and reads it
// as "echo", "sink N" (N a non-negative int64) or an unknown mode, exactly
// as requestReading, written from the documented requests rather than
// from handle's parsing, says. The report counts nothing (only the
// request came), and its error is the one the request calls for: none for
// echo (the client ended cleanly), "ended after 0 of N" for a sink of
// N > 0, none or the report's send for a sink of 0 (the report may or may
// not reach the client, which has gone), the mode's for a bad count or an
// unknown mode.
func FuzzServe(f *testing.F) {
	for _, s := range []string{"echo", "sink 3", "sink 0", " sink  0 ", "sink -1", "sink 99999999999999999999", "sink", "", "\x00echo",
		"ECHO", "sink 9223372036854775807", "sink 9223372036854775808", "sink 3 4", "sink x", "sink 0x10", "sink 1_000",
		"sink +3", "sink 007", "sink -0", "echo\n", "sink\t3", "sink\u00a03", "echo\u3000", "sink 3\xc2"} {
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
		if want := requestReading(msg); !want.matches(r) {
			t.Fatalf("%q served as %s with error %q, want %v", msg, r.Mode, r.Error, want)
		}
		if r.Messages != 0 || r.Bytes != 0 {
			t.Fatalf("%q served as %s: %d messages, %d bytes counted after the request", msg, r.Mode, r.Messages, r.Bytes)
		}
	})
}

// reading is one way serve may take a first message.
type reading struct {
	mode  string // "echo", "sink" or "?"
	count int64  // sink: N (-1: a bad count)
}

func (w reading) String() string {
	switch {
	case w.mode == "sink" && w.count < 0:
		return "sink refused (bad sink count)"
	case w.mode == "sink":
		return fmt.Sprintf("sink %d", w.count)
	case w.mode == "?":
		return "an unknown mode"
	}
	return w.mode
}

// matches says whether r is what serve reports for a request read as w,
// its client gone after the request.
func (w reading) matches(r result) bool {
	if r.Mode != w.mode {
		return false
	}
	switch {
	case w.mode == "echo":
		return r.Error == ""
	case w.mode == "?":
		return strings.Contains(r.Error, "unknown mode")
	case w.count < 0:
		return strings.Contains(r.Error, "bad sink count")
	case w.count == 0:
		// Nothing to wait for: the report goes at once, and only its
		// send may fail (the client has gone).
		return r.Error == "" || strings.HasPrefix(r.Error, "send ")
	}
	return strings.Contains(r.Error, fmt.Sprintf("ended after 0 of %d messages", w.count))
}

// requestReading is what a first message is taken for, by the requests
// the server documents (its package comment; the client's "sink %d"): the
// word "echo"; "sink", one space and N, a non-negative int64 in decimal
// digits as %d writes it; "sink " and anything else a bad count; any other
// message an unknown mode. White space, a sign or leading zeros are
// nowhere allowed.
func requestReading(msg []byte) reading {
	if string(msg) == "echo" {
		return reading{mode: "echo"}
	}
	n, ok := bytes.CutPrefix(msg, []byte("sink "))
	switch {
	case !ok:
		return reading{mode: "?"}
	case len(n) == 0 || n[0] == '0' && len(n) > 1 || !allDigits(n):
		return reading{mode: "sink", count: -1}
	}
	v, ok := decimal(n)
	if !ok {
		return reading{mode: "sink", count: -1}
	}
	return reading{mode: "sink", count: v}
}

func allDigits(b []byte) bool {
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// decimal is the value of the digits b (none: 0), false past an int64.
func decimal(b []byte) (int64, bool) {
	const maxInt64 = 1<<63 - 1
	var v int64
	for _, c := range b {
		d := int64(c - '0')
		if v > (maxInt64-d)/10 {
			return 0, false
		}
		v = v*10 + d
	}
	return v, true
}
