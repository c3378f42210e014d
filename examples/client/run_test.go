package main

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/goxrc/goxrc/cm"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// echoPair dials an echo server on the in-memory fabric (examples/server's
// echo mode, without the request) and returns the client's end.
func echoPair(t *testing.T, ctx context.Context) *cm.Conn {
	fab := memfabric.New()
	dir := t.TempDir()
	l, err := cm.Listen(ctx, "10.7.0.1:7471", cm.WithFabric(fab.Node("10.7.0.1").Process()), cm.WithDomainPath(dir+"/s"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		s, err := l.Accept(ctx)
		if err != nil {
			return
		}
		defer s.Close()
		buf := make([]byte, s.MaxRecvSize())
		for {
			n, err := s.Recv(ctx, buf)
			if err != nil || s.Send(ctx, buf[:n]) != nil {
				return
			}
		}
	}()
	c, err := cm.Dial(ctx, l.Addr().String(), cm.WithFabric(fab.Node("10.7.0.2").Process()), cm.WithDomainPath(dir+"/c"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// A huge -count (check takes any positive one) is a latency run that goes
// on until it is interrupted, not a panic allocating its samples up front
// (makeslice: cap out of range) or a run that first takes count*8 bytes.
func TestLatencyHugeCount(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := echoPair(t, ctx)
	run, stop := context.WithTimeout(ctx, 300*time.Millisecond) // the user's Ctrl-C
	defer stop()
	var r result
	err := latency(run, c, options{size: 64, count: math.MaxInt}, &r, newProgress(0, "latency", math.MaxInt))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("latency with -count MaxInt: %v, want it to run until interrupted", err)
	}
}
