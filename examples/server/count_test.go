package main

import (
	"context"
	"testing"
	"time"

	"github.com/goxrc/goxrc/cm"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// With -count N the listener stayed open until the N connections ended:
// a client that came after the Nth was connected (the listener completes
// handshakes before Accept) and its request went unanswered, without a
// word, for as long as the Nth connection lasted. Once the count is
// reached the listener is closed: the late client is refused, or its
// connection closed, not left waiting.
func TestCountClosesListener(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fab := memfabric.New()
	dir := t.TempDir()
	l, err := cm.Listen(ctx, "10.7.0.1:7471", cm.WithFabric(fab.Node("10.7.0.1").Process()), cm.WithDomainPath(dir+"/s"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	dial := func(name string) (*cm.Conn, error) {
		return cm.Dial(ctx, l.Addr().String(), cm.WithFabric(fab.Node("10.7.0.2").Process()), cm.WithDomainPath(dir+"/"+name))
	}
	done := make(chan bool, 1)
	go func() { done <- serveConns(ctx, l, 1, false, 0, true) }()
	// The one connection -count 1 serves, echoing, and held open.
	first, err := dial("first")
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	for _, m := range []string{"echo", "x"} {
		if err := first.Send(ctx, []byte(m)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := first.Recv(ctx, buf); err != nil {
		t.Fatal(err)
	}
	late, err := dial("late")
	if err == nil {
		for _, m := range []string{"echo", "y"} {
			if err = late.Send(ctx, []byte(m)); err != nil {
				break
			}
		}
		if err == nil {
			_, err = late.Recv(ctx, buf)
		}
		late.Close()
	}
	if err == nil || ctx.Err() != nil {
		t.Fatalf("a client after the count: %v (test context: %v), want it refused or let go", err, ctx.Err())
	}
	t.Logf("the late client: %v", err)
	// The connection being served is not cut off by the listener's close.
	if err := first.Send(ctx, []byte("z")); err != nil {
		t.Fatal(err)
	}
	if n, err := first.Recv(ctx, buf); err != nil || string(buf[:n]) != "z" {
		t.Fatalf("the served connection after the listener closed: %q, %v", buf[:n], err)
	}
	first.Close()
	if <-done {
		t.Error("serveConns reported a failure")
	}
}
