package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/goxrc/goxrc/cm"
	"github.com/goxrc/goxrc/xrc/memfabric"
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
	fab := memfabric.New()
	dir := t.TempDir()
	l, err := cm.Listen(ctx, "10.7.0.1:7471", cm.WithFabric(fab.Node("10.7.0.1").Process()), cm.WithDomainPath(dir+"/s"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	client := fab.Node("10.7.0.2").Process()
	c, err := cm.Dial(ctx, l.Addr().String(), cm.WithFabric(client), cm.WithDomainPath(dir+"/c"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
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
