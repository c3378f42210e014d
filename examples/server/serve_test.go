package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/goxrc/goxrc/cm"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// fabricPair connects a client to a listener on the in-memory fabric and
// returns the client's end and the listener, whose Accept gives the
// server's end.
func fabricPair(t testing.TB, ctx context.Context) (*cm.Conn, *cm.Listener) {
	c, l, _ := fabricPairProcess(t, ctx)
	return c, l
}

// fabricPairProcess is fabricPair that also returns the client's process,
// for a test to kill.
func fabricPairProcess(t testing.TB, ctx context.Context) (*cm.Conn, *cm.Listener, *memfabric.Process) {
	fab := memfabric.New()
	dir := t.TempDir()
	client := fab.Node("10.7.0.2").Process()
	l, err := cm.Listen(ctx, "10.7.0.1:7471", cm.WithFabric(fab.Node("10.7.0.1").Process()), cm.WithDomainPath(dir+"/s"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	c, err := cm.Dial(ctx, l.Addr().String(), cm.WithFabric(client), cm.WithDomainPath(dir+"/c"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, l, client
}

func accept(t *testing.T, ctx context.Context, l *cm.Listener) *cm.Conn {
	s, err := l.Accept(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A client that asks for "sink 5", sends one message and closes has not
// done what it asked: the connection's report is an error (and the exit
// status 1), not a sink of one message.
func TestSinkCutShortFails(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, l := fabricPair(t, ctx)
	for _, m := range []string{"sink 5", "x"} {
		if err := c.Send(ctx, []byte(m)); err != nil {
			t.Fatal(err)
		}
	}
	go c.Close()
	r := serve(ctx, accept(t, ctx, l), false, 0)
	if r.Mode != "sink" || r.Messages != 1 || !strings.Contains(r.Error, "ended after 1 of 5") {
		t.Fatalf("report %+v, want a sink of 1 message failing: ended after 1 of 5", r)
	}
}

// With -idle, a client that connects and sends nothing is let go, and
// the report says why (as no failure: TestIdleCloseIsNoError); one that
// keeps sending is not.
func TestIdleClientClosed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, l := fabricPair(t, ctx)
	// Wide margins: a message every tenth of the idle time, for one and a
	// half idle times (a loaded host stalls a goroutine for a while).
	const idle, gap, busy = 2 * time.Second, 200 * time.Millisecond, 15
	done := make(chan result, 1)
	go func() { done <- serve(ctx, accept(t, ctx, l), false, idle) }()
	if err := c.Send(ctx, []byte("echo")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	for range busy {
		time.Sleep(gap)
		if err := c.Send(ctx, []byte("x")); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Recv(ctx, buf); err != nil {
			t.Fatalf("an active client was let go: %v", err)
		}
	}
	select {
	case r := <-done:
		if !r.Idle || r.Error != "" || r.Messages != busy {
			t.Fatalf("report %+v, want %d messages, then closed for being idle (no error)", r, busy)
		}
	case <-ctx.Done():
		t.Fatal("an idle client was never let go")
	}
}
