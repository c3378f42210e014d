package xrc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// cancelEnv is one run of the cancel sweep: A dials B three times (the
// first brings the uplinks up, the second rides them, the third checks
// that nothing was left wedged); the kernel of trig is wrapped by a killAt
// whose "kill" cancels the context of the call under test (target: the
// Dial's, or B's Accept's) that is current at the n-th call of op.
type cancelEnv struct {
	t      *testing.T
	s      *sweepEnv // for finish's release checks
	a, b   *proc
	target string // "dial" or "accept"
	ka     *killAt

	mu      sync.Mutex
	cur     context.CancelFunc // the context the wrapper cancels
	step    string             // the step whose context cur is
	firedIn string             // the step it was cancelled in
	firedAt time.Time
	echoing bool // B's echo loop runs (the concurrent case)
}

func (c *cancelEnv) fire() {
	c.mu.Lock()
	cancel := c.cur
	c.firedIn, c.firedAt = c.step, time.Now()
	c.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

func (c *cancelEnv) setCur(step string, cancel context.CancelFunc) {
	c.mu.Lock()
	c.cur, c.step = cancel, step
	c.mu.Unlock()
}

// fired reports whether the wrapper cancelled step's context, and when.
func (c *cancelEnv) fired(step string) (bool, time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ka.killed.Load() && c.firedIn == step, c.firedAt
}

// newCancelEnv makes A and B; with a bystander (share: X on B's node, up
// with A; sharerev: X on A's node, up with B), X too, its connection kept.
func newCancelEnv(t *testing.T, target, trig, bystander, op string, n int64) *cancelEnv {
	c := &cancelEnv{t: t, target: target}
	s := &sweepEnv{t: t, w: newWorld(t), procs: map[string]*proc{}}
	c.s = s
	mk := func(name, ip string, port int) *proc {
		var wrap func(kernel.Kernel) kernel.Kernel
		if name == trig {
			wrap = func(k kernel.Kernel) kernel.Kernel {
				c.ka = &killAt{wrapper: wrapper{k}, op: op, n: n, kill: c.fire}
				return c.ka
			}
		}
		// A handshake timeout well past finish's waits: what a
		// cancel leaves until that timeout fails the run. So does
		// what the dialer leaves until its idle timeout (the
		// acceptor's half of a dial given up before its leg was bound
		// ends at the acceptor's, as docs/xrc-protocol.md says).
		p := s.w.wrappedEndpoint(ip, port, wrap, func(cfg *Config) {
			cfg.HandshakeTimeout = cancelHandshake
			if name == "A" {
				cfg.IdleTimeout = cancelHandshake
			}
		})
		s.procs[name] = p
		s.order = append(s.order, name)
		return p
	}
	switch bystander {
	case "share":
		x := mk("X", "10.0.0.2", 7000)
		c.a = mk("A", "10.0.0.1", 7000)
		c.b = mk("B", "10.0.0.2", 7001)
		s.pairKeep(c.a, x)
	case "sharerev":
		x := mk("X", "10.0.0.1", 7000)
		c.a = mk("A", "10.0.0.1", 7001)
		c.b = mk("B", "10.0.0.2", 7000)
		s.pairKeep(x, c.b)
	default:
		c.a = mk("A", "10.0.0.1", 7000)
		c.b = mk("B", "10.0.0.2", 7000)
	}
	return c
}

// cancelHandshake is the endpoints' handshake timeout, and the dialer's
// idle timeout, longer than every wait of finish (testIdle + testHeartbeat
// + 6 s) and of the cancelled calls' contexts (10 s).
const cancelHandshake = 20 * time.Second

// cancelPrompt is how soon a cancelled Dial or Accept must return, and a
// connection whose peer gave up must fail: well under the contexts' own
// deadlines (10 s), over a loaded -race run's scheduling.
const cancelPrompt = 3 * time.Second

// dialAccept runs one step: B accepts while A dials it, the context of the
// call under test cancelled if the wrapper fires in the step; then, with
// both ends up, a message each way (the context, if cancelled then, is
// one of a finished call: the connection outlives it).
func (c *cancelEnv) dialAccept(step string, armed bool) {
	t := c.t
	t.Helper()
	base, baseA := c.b.Stats().Conns, c.a.Stats().Conns
	dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer dcancel()
	actx, acancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer acancel()
	if armed {
		if c.target == "dial" {
			c.setCur(step, dcancel)
		} else {
			c.setCur(step, acancel)
		}
	}
	type res struct {
		c   *Conn
		err error
		at  time.Time
	}
	ach := make(chan res, 1)
	go func() {
		cn, err := c.b.Accept(actx)
		ach <- res{cn, err, time.Now()}
	}()
	dc, derr := c.a.Dial(dctx, c.b.Addr().String())
	dAt := time.Now()
	if derr == nil {
		c.s.keep(dc)
	}
	var ar res
	if derr != nil {
		// The dial failed: B's Accept may never return its half (what
		// the docs allow), once the half is gone; or return it, and
		// the connection must fail (below).
		deadline := time.Now().Add(testIdle + testHeartbeat + cancelPrompt)
	wait:
		for {
			select {
			case ar = <-ach:
				break wait
			case <-time.After(5 * time.Millisecond):
			}
			if c.b.Stats().Conns <= base {
				acancel()
				ar = <-ach
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("%s: the dial failed (%v), and B still holds its half: %+v", step, derr, c.b.Stats())
				acancel()
				ar = <-ach
				break
			}
		}
	} else {
		select {
		case ar = <-ach:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: Dial up, Accept hangs", step)
		}
	}
	if ar.err == nil {
		c.s.keep(ar.c)
	}
	fired, at := c.fired(step)
	if fired {
		t.Logf("%s cancelled: Dial %v; Accept %v", step, derr, ar.err)
	}
	if derr != nil {
		c.dialerReleased(step, baseA)
	} else {
		c.dialerReleased(step, baseA+1)
	}
	switch {
	case fired && c.target == "dial" && derr != nil:
		if !errors.Is(derr, context.Canceled) {
			t.Errorf("%s: cancelled Dial: %v, want context.Canceled", step, derr)
		}
		if d := dAt.Sub(at); d > cancelPrompt {
			t.Errorf("%s: cancelled Dial returned %v after the cancel", step, d)
		}
		if ar.err == nil {
			// The acceptor's half: it must not live on.
			ctx, cancel := context.WithTimeout(context.Background(), 2*cancelPrompt)
			_, err := ar.c.Recv(ctx, make([]byte, 64))
			cancel()
			if err == nil || errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("%s: Dial failed (%v), and B's Accept returned a connection whose Recv says %v", step, derr, err)
			}
		}
		return
	case fired && c.target == "accept" && ar.err != nil:
		if !errors.Is(ar.err, context.Canceled) {
			t.Errorf("%s: cancelled Accept: %v, want context.Canceled", step, ar.err)
		}
		if d := ar.at.Sub(at); d > cancelPrompt {
			t.Errorf("%s: cancelled Accept returned %v after the cancel", step, d)
		}
		if derr != nil {
			t.Errorf("%s: Accept's cancel failed the Dial: %v", step, derr)
			return
		}
		// The connection stays queued for the next Accept.
		ar.c, ar.err = c.b.Accept(ctxT(t, 10*time.Second))
		if ar.err != nil {
			t.Errorf("%s: the next Accept after a cancelled one: %v", step, ar.err)
			return
		}
		c.s.keep(ar.c)
	}
	if derr != nil || ar.err != nil {
		t.Errorf("%s (cancelled: %v): Dial %v, Accept %v", step, fired, derr, ar.err)
		return
	}
	roundTrip(t, dc, ar.c, []byte("to b "+step))
	roundTrip(t, ar.c, dc, []byte("to a "+step))
}

// A Dial or an Accept whose context is cancelled at any kernel call of
// either endpoint (memfabric; the wrapper cancels from inside the call,
// before it returns, or as it returns) returns promptly with
// context.Canceled, or, where the connection was up as the cancel came,
// with the connection, which works; the acceptor's half of a failed dial is
// never returned, or fails promptly; a Dial beside the cancelled one
// (concurrent: maybe waiting for the uplink the cancelled one brings up)
// works; the endpoints are not wedged (a later Dial with a fresh context
// works); once the connections close, the endpoints hold only their own
// objects, and once they close, every node and process holds nothing
// (finish, as TestKillAnywhere's). The same holds where a bystander X
// shares a node's domain (share: X on B's node, up with A, so B opens X's
// TGT; sharerev: X on A's node, up with B, so B's reverse leg rides its
// uplink to X's TGT, which A opens). Each case counts the kernel calls of
// its trigger process over its steps (dial1 brings up the uplinks, dial2
// rides them, dial3 is the check), then runs once for each call of each
// operation of killOps during the first two, before and after the call.
// No failure found (about 370 cancel points); GOXRC_KILL_SWEEP_OP and
// GOXRC_KILL_SWEEP_MAXN narrow a run.
func TestCancelAnywhere(t *testing.T) {
	for _, c := range []struct {
		target, trig string
		concurrent   bool
		bystander    string
	}{
		{"dial", "A", false, ""}, {"dial", "B", false, ""},
		{"accept", "A", false, ""}, {"accept", "B", false, ""},
		{"dial", "A", true, ""}, {"dial", "B", true, ""},
		{"dial", "A", false, "share"}, {"dial", "B", false, "share"},
		{"dial", "A", false, "sharerev"}, {"dial", "B", false, "sharerev"},
	} {
		name := c.target + "/by-" + c.trig
		if c.concurrent {
			name = "concurrent-" + name
		}
		if c.bystander != "" {
			name = c.bystander + "-" + name
		}
		steps := func(r *cancelEnv) {
			r.ka.armed.Store(true)
			for _, step := range []string{"dial1", "dial2"} {
				if c.concurrent {
					r.dialBeside(step)
				} else {
					r.dialAccept(step, true)
				}
			}
			r.ka.armed.Store(false)
			if c.concurrent {
				cn, err := r.a.Dial(ctxT(r.t, 10*time.Second), r.b.Addr().String())
				if err != nil {
					r.t.Fatalf("dial3: %v", err)
				}
				r.s.keep(cn)
				echoed(r.t, "dial3", cn)
			} else {
				r.dialAccept("dial3", false)
			}
			r.s.finish()
		}
		t.Run(name, func(t *testing.T) {
			cnt := newCancelEnv(t, c.target, c.trig, c.bystander, "", 0)
			steps(cnt)
			sweepCalls(t, cnt.ka.count, func(t *testing.T, op string, n int64, after bool) {
				r := newCancelEnv(t, c.target, c.trig, c.bystander, op, n)
				r.ka.after = after
				// A stuck run is a failure that names its case.
				stuck := time.AfterFunc(60*time.Second, func() {
					panic(fmt.Sprintf("%s: cancel at %s #%d (after=%v): the run hangs", name, op, n, after))
				})
				defer stuck.Stop()
				steps(r)
				if !r.ka.killed.Load() {
					t.Logf("no cancel: the run made fewer %s calls than the counting run", op)
				}
			})
		})
	}
}

// dialBeside runs one step of the concurrent case: A dials B twice at
// once, the first Dial's context cancelled if the wrapper fires in the
// step, the second's never; B echoes what each connection it accepts
// receives. The second Dial must work, and the first too unless it says
// context.Canceled, promptly.
func (c *cancelEnv) dialBeside(step string) {
	t := c.t
	t.Helper()
	c.echo(step)
	baseA := c.a.Stats().Conns
	dctx, dcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer dcancel()
	c.setCur(step, dcancel)
	var (
		wg     sync.WaitGroup
		cx, cy *Conn
		errX   error
		errY   error
		xAt    time.Time
	)
	wg.Add(2)
	go func() {
		defer wg.Done()
		cx, errX = c.a.Dial(dctx, c.b.Addr().String())
		xAt = time.Now()
	}()
	go func() {
		defer wg.Done()
		cy, errY = c.a.Dial(ctxT(t, 10*time.Second), c.b.Addr().String())
	}()
	wg.Wait()
	fired, at := c.fired(step)
	if fired {
		t.Logf("%s cancelled: Dial %v; the Dial beside it %v", step, errX, errY)
	}
	for _, cn := range []*Conn{cx, cy} {
		if cn != nil {
			c.s.keep(cn)
			baseA++
		}
	}
	c.dialerReleased(step, baseA)
	switch {
	case errX == nil:
		echoed(t, step, cx)
	case !fired:
		t.Errorf("%s (not cancelled): Dial %v", step, errX)
	default:
		if !errors.Is(errX, context.Canceled) {
			t.Errorf("%s: cancelled Dial: %v, want context.Canceled", step, errX)
		}
		if d := xAt.Sub(at); d > cancelPrompt {
			t.Errorf("%s: cancelled Dial returned %v after the cancel", step, d)
		}
	}
	if errY != nil {
		t.Errorf("%s: the Dial beside the cancelled one: %v", step, errY)
	} else {
		echoed(t, step, cy)
	}
}

// echo starts B's echo loop for step: it accepts until its endpoint
// closes, and each connection sends back what it receives until it ends.
func (c *cancelEnv) echo(step string) {
	if c.echoing {
		return
	}
	c.echoing = true
	s := c.s
	s.ends.Add(1)
	go func() {
		defer s.ends.Done()
		for {
			cn, err := c.b.Accept(context.Background())
			if err != nil {
				return
			}
			s.keep(cn)
			s.ends.Add(1)
			go func() {
				defer s.ends.Done()
				defer cn.Close()
				buf := make([]byte, 64)
				for {
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					n, err := cn.Recv(ctx, buf)
					if err == nil {
						err = cn.Send(ctx, buf[:n])
					}
					cancel()
					if err != nil {
						return
					}
				}
			}()
		}
	}()
}

// echoed checks that what cn sends comes back.
func echoed(t *testing.T, step string, cn *Conn) {
	t.Helper()
	msg := []byte("echo " + step)
	if err := cn.Send(ctxT(t, 5*time.Second), msg); err != nil {
		t.Errorf("%s: send: %v", step, err)
		return
	}
	buf := make([]byte, 64)
	n, err := cn.Recv(ctxT(t, 5*time.Second), buf)
	if err != nil || string(buf[:n]) != string(msg) {
		t.Errorf("%s: echo: %v %q", step, err, buf[:n])
	}
}

// dialerReleased checks that A, its Dials of step returned, soon holds
// want connections (those it keeps, none of a failed Dial) and no SIDR id
// of a finished exchange: at once, not at a timeout.
func (c *cancelEnv) dialerReleased(step string, want int) {
	c.t.Helper()
	deadline := time.Now().Add(cancelPrompt)
	for {
		st := c.a.Stats()
		going := c.a.sidrGoing.Load()
		if st.Conns == want && going == 0 {
			return
		}
		if time.Now().After(deadline) {
			c.t.Errorf("%s: the dialer holds %d connections (want %d) and %d SIDR ids: %+v", step, st.Conns, want, going, st)
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}
