package main

import (
	"context"
	"strings"
	"testing"
	"time"
)

// A connection that broke (its client's process died) as the shutdown
// began was taken for one the shutdown ended: Recv answers a context that
// has ended before the connection's failure, and the report said
// "shutdown": true, no error, exit status 0. The connection's Stats say
// it broke: it is reported as failed. The test has its server's end see
// the failure first, then serves it with a context that has ended.
func TestBrokenAtInterruptFails(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, l, client := fabricPairProcess(t, ctx)
	s := accept(t, ctx, l)
	client.Kill()
	if _, err := s.Recv(ctx, make([]byte, 64)); err == nil || ctx.Err() != nil || s.Stats().Errors == 0 {
		t.Fatalf("the server's end after its client's death: %v (test context: %v), %d errors; want it broken", err, ctx.Err(), s.Stats().Errors)
	}
	ended, end := context.WithCancel(ctx)
	end() // the Ctrl-C
	r := serve(ended, s, false, 0)
	if r.Shutdown || r.Error == "" || !strings.Contains(r.Error, "broke") {
		t.Fatalf("report %+v, want a failure (the connection broke), not closed by the shutdown", r)
	}
}
