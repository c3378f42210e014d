package xrc

import (
	"errors"
	"fmt"
	"io"
	"math/rand"
	"sync"
	"testing"
	"time"
)

// Torture: traffic on many connections while connections close, a
// receiver process is killed and a sender endpoint closes. Every blocked
// Send/Recv must return within a bound; nothing may be left.
func TestEndpointTorture(t *testing.T) {
	w := newWorld(t)
	small := func(c *Config) { c.RecvWindow = 2 }
	as := []*proc{w.endpoint("10.0.50.1", 7001, small), w.endpoint("10.0.50.1", 7002, small)}
	bs := []*proc{w.endpoint("10.0.50.2", 7001, small), w.endpoint("10.0.50.2", 7002, small), w.endpoint("10.0.50.2", 7003, small)}
	type cp struct {
		a, b   *Conn
		ai, bi int
	}
	var conns []cp
	var mu sync.Mutex
	var wg sync.WaitGroup
	for ai, a := range as {
		for bi, b := range bs {
			for range 3 {
				ca, cb := pair(t, a, b)
				mu.Lock()
				conns = append(conns, cp{ca, cb, ai, bi})
				mu.Unlock()
			}
		}
	}
	wg.Wait()
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewSource(seed))
	ctx := ctxT(t, 30*time.Second)
	type res struct {
		what string
		err  error
		at   time.Time
	}
	results := make(chan res, 4*len(conns))
	var running, mustEnd sync.WaitGroup
	ends := make([]int, len(conns))
	for i, c := range conns {
		ends[i] = rng.Intn(4)
		if c.bi == 2 || c.ai == 1 {
			ends[i] = 9
		}
		if ends[i] == 0 || ends[i] == 1 || ends[i] == 9 {
			mustEnd.Add(4)
		}
	}
	for i, c := range conns {
		for dir, pr := range [][2]*Conn{{c.a, c.b}, {c.b, c.a}} {
			running.Add(2)
			end := func() {
				running.Done()
				if ends[i] == 0 || ends[i] == 1 || ends[i] == 9 {
					mustEnd.Done()
				}
			}
			go func() {
				defer end()
				var err error
				for err == nil {
					err = pr[0].Send(ctx, []byte("m"))
				}
				results <- res{fmt.Sprintf("send %d/%d", i, dir), err, time.Now()}
			}()
			go func() {
				defer end()
				buf := make([]byte, 16)
				var err error
				for err == nil {
					_, err = pr[1].Recv(ctx, buf)
					if rng2 := time.Now().UnixNano() % 5; rng2 == 0 {
						time.Sleep(time.Millisecond)
					}
				}
				results <- res{fmt.Sprintf("recv %d/%d", i, dir), err, time.Now()}
			}()
		}
	}
	time.Sleep(100 * time.Millisecond)
	// Events.
	for i, c := range conns {
		switch ends[i] {
		case 0:
			go c.a.Close()
		case 1:
			go c.b.Close()
		case 2:
			go c.a.CloseWrite()
		}
	}
	time.Sleep(time.Duration(rng.Intn(50)) * time.Millisecond)
	bs[2].p.Kill()
	time.Sleep(time.Duration(rng.Intn(50)) * time.Millisecond)
	start := time.Now()
	as[1].Close()
	t.Logf("as[1].Close took %v", time.Since(start))
	ended := make(chan struct{})
	go func() { mustEnd.Wait(); close(ended) }()
	select {
	case <-ended:
		t.Logf("all that must end ended after %v", time.Since(start))
	case <-time.After(5 * time.Second):
		t.Errorf("connections closed, or to a killed or closed process, still blocked 5s later")
	}
	// Now close every conn left.
	for _, c := range conns {
		go c.a.Close()
		go c.b.Close()
	}
	done := make(chan struct{})
	go func() { running.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatalf("Send/Recv still blocked 10s after every Close")
	}
	close(results)
	hist := map[string]int{}
	var all []res
	for r := range results {
		all = append(all, r)
		hist[fmt.Sprint(r.err)]++
	}
	t.Logf("errors: %v", hist)
	for _, r := range all {
		if r.err == nil || errors.Is(r.err, io.EOF) || errors.Is(r.err, ErrClosed) || errors.Is(r.err, ErrPeerClosed) || errors.Is(r.err, ErrPeerGone) ||
			errors.Is(r.err, ErrProcessDied) { // the killed process's own
			continue
		}
		t.Errorf("%s: %v", r.what, r.err)
	}
	// Survivors: once every connection is closed, nothing may be left.
	for _, p := range []*proc{as[0], bs[0], bs[1]} {
		eventuallyWithin(t, 4*time.Second, "survivor "+p.Addr().String()+" empty", func() (bool, string) {
			st := p.Stats()
			p.mu.Lock()
			var ups []string
			for _, u := range p.uplinks {
				ups = append(ups, fmt.Sprintf("%v refs=%d legs=%d inis=%d", u.state, u.refs, len(u.legs), len(u.inis)))
			}
			p.mu.Unlock()
			return st.Conns == 0 && st.QPs == 0 && st.LocalCounts == 0 && st.KernelHandles == 4 && len(ups) == 0, fmt.Sprintf("%+v %v", st, ups)
		})
	}
	for _, p := range append(as, bs...) {
		p.Close()
	}
	for _, ip := range []string{"10.0.50.1", "10.0.50.2"} {
		if st := w.f.Node(ip).Stats(); st.QPs() != 0 || st.TGTHandles != 0 {
			t.Errorf("node %s: %+v", ip, st)
		}
	}
}
