package cm

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/conntest"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// A Dial over the fabric (XRC) whose context is cancelled at any moment
// of its run returns promptly, with context.Canceled or, up as the cancel
// came, with a connection that works; the listener never hands out the
// half of a failed dial that lives on (the echo server's Recv ends it);
// the next Dial with a fresh context works; and once everything closes,
// both nodes and processes hold nothing. The cancel comes after a delay
// swept over a Dial's measured length: the first Dial (which opens the
// process's dialer endpoint and brings up the uplink), a second one beside
// a connection kept open (over the live uplink), and a first one with
// another Dial of the process at once (which shares the dialer endpoint
// one of them opens, and the uplink): that one must work.
func TestFabricCancelAnywhere(t *testing.T) {
	const steps = 24
	for _, c := range []struct {
		name           string
		second, beside bool
	}{{"first", false, false}, {"second", true, false}, {"first-beside", false, true}} {
		t.Run(c.name, func(t *testing.T) {
			var length time.Duration
			for range 3 { // the longest of three uncancelled runs
				length = max(length, fabricCancelRun(t, c.second, c.beside, -1))
			}
			for i := range steps + 1 {
				d := length * time.Duration(i) / steps
				t.Run(fmt.Sprint(i), func(t *testing.T) { fabricCancelRun(t, c.second, c.beside, d) })
			}
		})
	}
}

// fabricCancelRun runs the scenario, cancelling the Dial under test after
// delay (never with delay < 0), and returns that Dial's length.
func fabricCancelRun(t *testing.T, second, beside bool, delay time.Duration) time.Duration {
	t.Helper()
	const prompt = 3 * time.Second
	f := newFabric(t)
	srv, cli := f.Node("10.9.7.1"), f.Node("10.9.7.2")
	short := func(c *config) { c.xrcHeartbeat, c.xrcIdle = 25*time.Millisecond, time.Second }
	dir := t.TempDir()
	sp, cp := srv.Process(), cli.Process()
	l, err := Listen(context.Background(), "10.9.7.1:7000", WithFabric(sp), WithDomainPath(filepath.Join(dir, "s")), short)
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []*Conn
		wg    sync.WaitGroup
	)
	keep := func(c *Conn) {
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
	}
	wg.Add(1)
	go func() { // echo server
		defer wg.Done()
		for {
			c, err := l.Accept(context.Background())
			if err != nil {
				return
			}
			keep(c)
			wg.Add(1)
			go func() {
				defer wg.Done()
				buf := make([]byte, 64)
				for {
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					n, err := c.Recv(ctx, buf)
					if err == nil {
						err = c.Send(ctx, buf[:n])
					}
					cancel()
					if err != nil {
						c.Close()
						return
					}
				}
			}()
		}
	}()
	dial := func(ctx context.Context) (*Conn, error) {
		return Dial(ctx, "10.9.7.1:7000", WithFabric(cp), WithDomainPath(filepath.Join(dir, "c")), short)
	}
	echoed := func(what string, c *Conn) {
		t.Helper()
		msg := []byte("echo " + what)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := c.Send(ctx, msg); err != nil {
			t.Errorf("%s: send: %v", what, err)
			return
		}
		buf := make([]byte, 64)
		n, err := c.Recv(ctx, buf)
		if err != nil || string(buf[:n]) != string(msg) {
			t.Errorf("%s: echo: %v %q", what, err, buf[:n])
		}
	}
	if second {
		c, err := dial(ctxFor(t, 10*time.Second))
		if err != nil {
			t.Fatalf("first dial: %v", err)
		}
		keep(c)
		echoed("first dial", c)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var cancelled time.Time
	var cmu sync.Mutex
	if delay >= 0 {
		stop := time.AfterFunc(delay, func() {
			cmu.Lock()
			cancelled = time.Now()
			cmu.Unlock()
			cancel()
		})
		defer stop.Stop()
	}
	var (
		bc   *Conn
		berr error
		bwg  sync.WaitGroup
	)
	if beside {
		bwg.Add(1)
		go func() {
			defer bwg.Done()
			bc, berr = dial(ctxFor(t, 10*time.Second))
		}()
	}
	start := time.Now()
	c, err := dial(ctx)
	end := time.Now()
	bwg.Wait()
	if beside {
		if berr != nil {
			t.Errorf("the dial beside: %v", berr)
		} else {
			keep(bc)
			echoed("the dial beside", bc)
		}
	}
	cmu.Lock()
	at := cancelled
	cmu.Unlock()
	if delay >= 0 {
		t.Logf("cancel after %v (dial of %v): %v", delay, end.Sub(start), err)
	}
	switch {
	case err == nil:
		keep(c)
		echoed("dial", c)
	case at.IsZero():
		t.Errorf("dial (not cancelled): %v", err)
	default:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("cancelled dial: %v, want context.Canceled", err)
		}
		if d := end.Sub(at); d > prompt {
			t.Errorf("cancelled dial returned %v after the cancel", d)
		}
	}
	// Not wedged: a Dial with a fresh context works.
	if c, err := dial(ctxFor(t, 10*time.Second)); err != nil {
		t.Errorf("the dial after: %v", err)
	} else {
		keep(c)
		echoed("the dial after", c)
	}
	// The half of a failed dial does not live on at the listener's side.
	want := 1
	if second || beside {
		want++
	}
	if err == nil {
		want++
	}
	conntest.Eventually(t, 5*time.Second, "the server's connections", func() (bool, string) {
		s := l.xep.Stats()
		return s.Conns == want, fmt.Sprintf("%+v, want %d connections", s, want)
	})
	mu.Lock()
	all := append([]*Conn(nil), conns...)
	mu.Unlock()
	for _, c := range all {
		c.Close()
	}
	l.Close()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("the echo server hangs")
	}
	for _, n := range []*memfabric.Node{srv, cli} {
		conntest.Eventually(t, 5*time.Second, "node empty", func() (bool, string) {
			s := n.Stats()
			return s.INIs == 0 && s.TGTs == 0 && s.TGTHandles == 0 && s.XRCDs == 0, fmt.Sprintf("%+v", s)
		})
	}
	for _, p := range []*memfabric.Process{sp, cp} {
		conntest.Eventually(t, 5*time.Second, "process holds nothing", func() (bool, string) {
			return p.Handles() == 0, fmt.Sprint(p.Handles())
		})
	}
	return end.Sub(start)
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
