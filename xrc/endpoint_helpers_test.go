package xrc

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/conntest"
	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// Timings for the engine tests: short, so that crash detection is quick.
const (
	testHeartbeat = 25 * time.Millisecond
	testIdle      = time.Second
	testHandshake = 5 * time.Second
)

// world is a memfabric with one domain directory per node.
type world struct {
	t    *testing.T
	f    *memfabric.Fabric
	dirs map[string]string
}

func newWorld(t *testing.T) *world {
	checkGoroutines(t)
	return &world{t: t, f: memfabric.New(), dirs: map[string]string{}}
}

// proc is an endpoint with its process.
type proc struct {
	*Endpoint
	p *memfabric.Process
}

func (w *world) endpoint(ip string, port int, mod ...func(*Config)) *proc {
	w.t.Helper()
	return w.wrappedEndpoint(ip, port, nil, mod...)
}

// wrappedEndpoint is endpoint with the engine's kernel wrapped: wrap (if not
// nil) gets the process's kernel and returns what the engine talks to, a
// test's stand-in that holds back or alters some calls.
func (w *world) wrappedEndpoint(ip string, port int, wrap func(kernel.Kernel) kernel.Kernel, mod ...func(*Config)) *proc {
	w.t.Helper()
	if w.dirs[ip] == "" {
		w.dirs[ip] = w.t.TempDir() + "/goxrc"
	}
	p := w.f.Node(ip).Process()
	cfg := Config{Process: p, Addr: fmt.Sprintf("%s:%d", ip, port), DomainDir: w.dirs[ip],
		Heartbeat: testHeartbeat, IdleTimeout: testIdle, HandshakeTimeout: testHandshake}
	for _, m := range mod {
		m(&cfg)
	}
	k, _ := kernel.Unwrap(p)
	if wrap != nil {
		k = wrap(k)
	}
	e, err := newEndpoint(context.Background(), k, cfg)
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() {
		e.Close()
		e.mu.Lock()
		n := e.iniSetup
		e.mu.Unlock()
		if n != 0 {
			w.t.Errorf("%v: iniSetup %d after Close, want 0", e.addr, n)
		}
	})
	return &proc{e, p}
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// pair dials from a to b and accepts on b.
func pair(t *testing.T, a, b *proc) (*Conn, *Conn) {
	t.Helper()
	type res struct {
		c   *Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		c, err := b.Accept(ctxT(t, 5*time.Second))
		ch <- res{c, err}
	}()
	ca, err := a.Dial(ctxT(t, 5*time.Second), b.Addr().String())
	if err != nil {
		t.Fatalf("dial %v -> %v: %v", a.Addr(), b.Addr(), err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatalf("accept on %v: %v", b.Addr(), r.err)
	}
	if r.c.RemoteAddr() != a.Addr() || ca.RemoteAddr() != b.Addr() {
		t.Fatalf("addresses: %v / %v", r.c.RemoteAddr(), ca.RemoteAddr())
	}
	return ca, r.c
}

// roundTrip sends msg on c and checks that d receives exactly it.
func roundTrip(t *testing.T, c, d *Conn, msg []byte) {
	t.Helper()
	if err := c.Send(ctxT(t, 5*time.Second), msg); err != nil {
		t.Fatalf("send: %v", err)
	}
	buf := make([]byte, len(msg)+16)
	n, err := d.Recv(ctxT(t, 5*time.Second), buf)
	if err != nil || !bytes.Equal(buf[:n], msg) {
		t.Fatalf("recv: %v %q, want %q", err, buf[:n], msg)
	}
}

// requireReleased waits until the nodes of procs hold no QP and no TGT
// handle, and each endpoint no connection, QP or local count: only its
// domain, its SRQ and its two listeners (4 kernel handles). It waits 5 s
// more than the longest idle timeout among procs: a process that shares a
// dead sender's TGT learns of the death only by that timeout.
func requireReleased(t *testing.T, w *world, procs ...*proc) {
	t.Helper()
	var idle time.Duration
	for _, p := range procs {
		idle = max(idle, p.cfg.IdleTimeout+p.cfg.Heartbeat)
	}
	for _, p := range procs {
		ip := p.Addr().Addr().String()
		n := w.f.Node(ip)
		eventuallyWithin(t, idle+5*time.Second, "node "+ip+" empty", func() (bool, string) {
			s := n.Stats()
			return s.QPs() == 0 && s.TGTHandles == 0, fmt.Sprintf("%+v", s)
		})
	}
	for _, p := range procs {
		eventually(t, "endpoint "+p.Addr().String()+" empty", func() (bool, string) {
			s := p.Stats()
			return s.Conns == 0 && s.QPs == 0 && s.LocalCounts == 0 && s.KernelHandles == 4, fmt.Sprintf("%+v", s)
		})
	}
}

// eventually polls cond until it holds or 5 s pass.
// sidrIDsDestroyed waits until p has destroyed every SIDR id it is done
// with: they go in the background (destroyLater), maybe after the Dial or
// Accept that used one returned, and a count of p's kernel handles taken
// before then includes them.
func sidrIDsDestroyed(t *testing.T, p *proc) {
	t.Helper()
	eventually(t, "finished SIDR ids destroyed", func() (bool, string) {
		n := p.sidrGoing.Load()
		return n == 0, fmt.Sprint(n)
	})
}

func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	eventuallyWithin(t, 5*time.Second, what, cond)
}

// eventuallyWithin polls cond until it holds or d passes.
func eventuallyWithin(t *testing.T, d time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	conntest.Eventually(t, d, what, cond)
}

// checkGoroutines fails the test if goroutines outlive it (after every
// cleanup, which closes the endpoints).
func checkGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	t.Cleanup(func() {
		deadline := time.Now().Add(3 * time.Second)
		for runtime.NumGoroutine() > before {
			if time.Now().After(deadline) {
				buf := make([]byte, 1<<20) // every goroutine of every open world
				n := runtime.Stack(buf, true)
				var ours []string
				for _, g := range strings.Split(string(buf[:n]), "\n\n") {
					if strings.Contains(g, "goxrc/xrc") {
						ours = append(ours, g)
					}
				}
				t.Errorf("goroutine leak: %d before, %d after:\n%s", before, runtime.NumGoroutine(), strings.Join(ours, "\n\n"))
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
}

// sendErr sends on c until a Send fails, as one does once the failure of an
// earlier message (which Send, returning when it is posted, does not wait
// for) has ended the connection, and returns that error; nil if every Send
// for 5 s succeeded.
func sendErr(t *testing.T, c *Conn) error {
	ctx := ctxT(t, 5*time.Second)
	for ctx.Err() == nil {
		if err := c.Send(ctx, []byte("x")); err != nil {
			return err
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

// wrapper is what a test's stand-in for the kernel (wrappedEndpoint)
// embeds: the kernel it wraps, and that kernel's handle count, which the
// endpoint's Stats reads.
type wrapper struct{ kernel.Kernel }

func (k wrapper) Handles() int { return k.Kernel.(interface{ Handles() int }).Handles() }
