package memfabric_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/goxrc/goxrc/xrc"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// TestPauseLongerThanIdleTimeout: the paused process's engine runs on, its
// janitor too, so a pause longer than its idle timeout fails its
// connections for their peers' silence, the message that waits for it on
// the SRQ with it (PauseReceives' doc).
func TestPauseLongerThanIdleTimeout(t *testing.T) {
	f := memfabric.New()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sp, cp := f.Node("10.5.0.2").Process(), f.Node("10.5.0.1").Process()
	defer sp.Kill()
	defer cp.Kill()
	cfg := func(p *memfabric.Process, addr string) xrc.Config {
		return xrc.Config{Process: p, Addr: addr, Heartbeat: 50 * time.Millisecond, IdleTimeout: 200 * time.Millisecond}
	}
	srv, err := xrc.NewEndpoint(ctx, cfg(sp, "10.5.0.2:7000"))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	cli, err := xrc.NewEndpoint(ctx, cfg(cp, "10.5.0.1:7000"))
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	accepted := make(chan *xrc.Conn, 1)
	go func() { s, _ := srv.Accept(ctx); accepted <- s }()
	c, err := cli.Dial(ctx, "10.5.0.2:7000")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := <-accepted
	if s == nil {
		t.Fatal("no connection accepted")
	}
	defer s.Close()
	sp.PauseReceives()
	if err := c.Send(ctx, []byte("x")); err != nil {
		t.Fatal(err)
	}
	for s.Err() == nil && ctx.Err() == nil { // until the paused side's janitor fails it
		time.Sleep(10 * time.Millisecond)
	}
	sp.ResumeReceives()
	if _, err := s.Recv(ctx, make([]byte, 64)); !errors.Is(err, xrc.ErrPeerGone) {
		t.Fatalf("Recv after a pause past the idle timeout: %v, want ErrPeerGone (Err %v)", err, s.Err())
	}
}
