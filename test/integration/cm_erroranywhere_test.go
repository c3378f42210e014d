//go:build linux && cgo

package integration

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/goxrc/goxrc/cm"
	"github.com/goxrc/goxrc/internal/faults"
	"github.com/goxrc/goxrc/rdmacm"
	"github.com/goxrc/goxrc/test/softroce"
	"github.com/goxrc/goxrc/verbs"
)

// eaErrFor is, for each set-up and tear-down C call of the bindings that
// cm's RC path makes (those with a faults.Check), the errno a device or the
// kernel fails it with: ENOMEM for creates, allocations and registrations,
// EINVAL for a QP modify and for the CM calls that refuse a wrong state,
// ETIMEDOUT for resolution, EADDRINUSE for bind and listen, EIO for the CM
// messages (REQ, REP). The event reads (rdma_get_cm_event,
// ibv_get_async_event) and the destroys (rdma_destroy_id, ibv_destroy_cq,
// ibv_destroy_comp_channel) are left out although they are checkable: a
// failed event read breaks the channel for every id on it
// (TestCMDialAfterChannelBroke tests that), and a refused destroy keeps
// its object by contract, which the leak check here would report.
var eaErrFor = map[string]syscall.Errno{
	"rdma_create_event_channel": syscall.ENOMEM,
	"rdma_create_id":            syscall.ENOMEM,
	"rdma_create_ep":            syscall.ENOMEM,
	"rdma_bind_addr":            syscall.EADDRINUSE,
	"rdma_resolve_addr":         syscall.ETIMEDOUT,
	"rdma_resolve_route":        syscall.ETIMEDOUT,
	"rdma_listen":               syscall.EADDRINUSE,
	"rdma_connect":              syscall.EIO,
	"rdma_accept":               syscall.EIO,
	"rdma_reject":               syscall.EINVAL,
	"rdma_establish":            syscall.EINVAL,
	"rdma_disconnect":           syscall.EINVAL,
	"rdma_init_qp_attr":         syscall.EINVAL,
	"ibv_alloc_pd":              syscall.ENOMEM,
	"ibv_create_comp_channel":   syscall.ENOMEM,
	"ibv_create_cq":             syscall.ENOMEM,
	"ibv_create_qp_ex":          syscall.ENOMEM,
	"ibv_reg_mr":                syscall.ENOMEM,
	"ibv_modify_qp":             syscall.EINVAL,
	"ibv_req_notify_cq":         syscall.EIO,
}

// eaMaxN bounds the calls of one op that are failed in turn: the 1st, 2nd
// and 3rd, not every one (ibv_reg_mr and ibv_modify_qp are made more often
// as connections come and go), to bound the run time. The first calls are
// the set-up's; the teardown's of the same op are alike.
const eaMaxN = 3

// eaHook counts the calls of every op while armed and fails the n-th call
// of op (n 0: none) with its errno from eaErrFor, the C call not made.
type eaHook struct {
	armed  atomic.Bool
	mu     sync.Mutex
	counts map[string]int
	op     string
	n      int
	fired  bool
}

func newEAHook(op string, n int) *eaHook { return &eaHook{counts: map[string]int{}, op: op, n: n} }

func (h *eaHook) check(op string) error {
	if !h.armed.Load() {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.counts[op]++
	if h.n > 0 && op == h.op && h.counts[op] == h.n {
		h.fired = true
		return eaErrFor[op]
	}
	return nil
}

func (h *eaHook) count(op string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.counts[op]
}

func (h *eaHook) didFire() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.fired
}

// eaCall is a user-visible call's error.
type eaCall struct {
	call string
	err  error
}

// eaEnv is one run of the scenario (eaScenario).
type eaEnv struct {
	t     *testing.T
	h     *eaHook
	ip    netip.Addr
	mu    sync.Mutex
	calls []eaCall
	hangs []string
	hung  atomic.Bool
	// listenerFailed: Listen or an Accept failed (not for the loop's end).
	listenerFailed atomic.Bool
}

// do runs the user-visible call f with a context that ends after d, and
// records its error; a call that outlives its context by 3 s hangs.
func (s *eaEnv) do(call string, d time.Duration, f func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return s.doCtx(call, ctx, d, f)
}

// doCtx is do with the caller's ctx, which ends within d.
func (s *eaEnv) doCtx(call string, ctx context.Context, d time.Duration, f func(ctx context.Context) error) error {
	done := make(chan error, 1)
	go func() { done <- f(ctx) }()
	select {
	case err := <-done:
		if err != nil && !errors.Is(err, io.EOF) {
			s.mu.Lock()
			s.calls = append(s.calls, eaCall{call, err})
			s.mu.Unlock()
		}
		return err
	case <-time.After(d + 3*time.Second):
		// Reported by eaRun: this may run in a goroutine that outlives
		// the test.
		s.mu.Lock()
		s.hangs = append(s.hangs, fmt.Sprintf("%s hangs past its context (%v)", call, d))
		s.mu.Unlock()
		s.hung.Store(true)
		return context.DeadlineExceeded
	}
}

// eaSend sends msg on c and eaRecv receives one message on c and checks it
// is want.
func (s *eaEnv) eaSend(call string, c *cm.Conn, msg string) error {
	return s.do(call, eaTimeout, func(ctx context.Context) error { return c.Send(ctx, []byte(msg)) })
}

func (s *eaEnv) eaRecv(call string, c *cm.Conn, want string) error {
	buf := make([]byte, 64)
	return s.do(call, eaTimeout, func(ctx context.Context) error {
		n, err := c.Recv(ctx, buf)
		if err == nil && string(buf[:n]) != want {
			err = fmt.Errorf("got %q, want %q", buf[:n], want)
		}
		return err
	})
}

// eaEnd receives on c until the peer's end: its end of stream (io.EOF),
// or, where its disconnect overtook that, ErrPeerGone (both are what a
// Recv after the peer's Close returns; see cm_robust_test.go).
func (s *eaEnv) eaEnd(call string, c *cm.Conn) {
	buf := make([]byte, 64)
	s.do(call, eaTimeout, func(ctx context.Context) error {
		n, err := c.Recv(ctx, buf)
		if err == nil {
			err = fmt.Errorf("got %q after the last message", buf[:n])
		}
		if errors.Is(err, cm.ErrPeerGone) {
			err = nil
		}
		return err
	})
}

func (s *eaEnv) eaClose(call string, c io.Closer) {
	s.do(call, eaTimeout, func(context.Context) error { return c.Close() })
}

// eaTimeout bounds each call of the scenario: its context, and (through
// WithHandshakeTimeout) what Close and the acceptor's handshake wait.
const eaTimeout = 10 * time.Second

// eaScenario: Listen on the device's address; a goroutine accepts in a
// loop, each accepted connection receiving "ping", answering "pong",
// reading to the end (the dialer's Close) and closing; Dial sends "ping",
// receives "pong" and closes. It returns the listener (nil where Listen
// failed), still open, once every call of the scenario returned and its
// connections are released (their time-wait over: what their teardown
// does is part of the run).
func (s *eaEnv) eaScenario(base objects) *cm.Listener {
	t := s.t
	var l *cm.Listener
	err := s.do("Listen", eaTimeout, func(ctx context.Context) error {
		var err error
		l, err = cm.Listen(ctx, netip.AddrPortFrom(s.ip, 0).String(), cm.WithHandshakeTimeout(eaTimeout))
		return err
	})
	if err != nil {
		s.listenerFailed.Store(true)
		return nil
	}
	stop, stopAccepting := context.WithTimeout(context.Background(), 60*time.Second)
	defer stopAccepting()
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			var c *cm.Conn
			err := s.doCtx("Accept", stop, 60*time.Second, func(ctx context.Context) error {
				var err error
				c, err = l.Accept(ctx)
				if err != nil && stop.Err() != nil {
					return nil // the loop's end, not a failure
				}
				return err
			})
			if err != nil {
				s.listenerFailed.Store(true)
				return
			}
			if c == nil {
				return
			}
			wg.Go(func() {
				if s.eaRecv("accepted Recv", c, "ping") == nil && s.eaSend("accepted Send", c, "pong") == nil {
					s.eaEnd("accepted Recv to the end", c)
				}
				s.eaClose("accepted Close", c)
			})
		}
	})
	var c *cm.Conn
	err = s.do("Dial", eaTimeout, func(ctx context.Context) error {
		var err error
		c, err = cm.Dial(ctx, l.Addr().String(), cm.WithHandshakeTimeout(eaTimeout))
		return err
	})
	if err == nil {
		if s.eaSend("Dial's Send", c, "ping") == nil {
			s.eaRecv("Dial's Recv", c, "pong")
		}
		s.eaClose("Dial's Close", c)
	}
	// The accepted connection (if any) closes after the dialer's end;
	// then the loop may stop: a request the dialer abandoned never comes.
	deadline := time.Now().Add(30 * time.Second)
	for cm.GlobalStats().ConnectionsOpen > base.cm.ConnectionsOpen && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	stopAccepting()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		s.hung.Store(true)
		t.Errorf("the accept loop and its connections hang")
	}
	// The connections' teardown ends with their time-wait (the QPs go
	// back to the device's cache, or are destroyed): wait for it, the
	// hook still armed.
	for {
		st := cm.GlobalStats()
		if st.ConnectionsOpen == base.cm.ConnectionsOpen && st.QueuePairs == base.cm.QueuePairs {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("connections not released 30 s after the dial: %+v (at start %+v)", st, base.cm)
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	return l
}

// check judges the errors the scenario's calls returned: each is the
// injected errno, naming the C call that failed; a consequence of it seen
// elsewhere (the peer's refusal, a lost connection, a closed listener:
// cm's errors); or another C call's error with its errno; never a
// context's (a call that waited out its context for an answer that the
// failure made impossible).
func (s *eaEnv) check(op string) {
	t := s.t
	errno := eaErrFor[op]
	s.mu.Lock()
	calls := append([]eaCall(nil), s.calls...)
	s.mu.Unlock()
	for _, c := range calls {
		t.Logf("%s: %v", c.call, c.err)
		switch {
		case errors.Is(c.err, context.DeadlineExceeded), errors.Is(c.err, context.Canceled):
			// Also where it wraps the injected errno too (a Close that
			// waited its whole timeout after the failure).
			t.Errorf("%s: %v: waited out its context", c.call, c.err)
		case errno != 0 && errors.Is(c.err, errno):
			if !strings.Contains(c.err.Error(), op) {
				t.Errorf("%s: %v: the injected %v does not name %s", c.call, c.err, errno, op)
			}
		case errors.Is(c.err, cm.ErrPeerGone), errors.Is(c.err, cm.ErrClosed), errors.Is(c.err, cm.ErrProtocol),
			errors.Is(c.err, cm.ErrDeviceRemoved), errors.Is(c.err, syscall.ECONNREFUSED):
			// The failure seen from the other side, or its refusal.
		case eaKernelErr(c.err):
			// Another C call's error, named, with its errno.
		default:
			t.Errorf("%s: %v: neither the injected %v nor one of cm's errors", c.call, c.err, errno)
		}
	}
	if s.h.n > 0 && s.h.didFire() && len(calls) == 0 {
		t.Logf("the failed %s call (#%d) was absorbed: no call returned an error", op, s.h.n)
	}
}

// eaKernelErr reports whether err names a C call and its errno.
func eaKernelErr(err error) bool {
	var oe *verbs.OpError
	var errno syscall.Errno
	var re *rdmacm.RejectError
	return errors.As(err, &oe) && errors.As(oe.Err, &errno) || errors.As(err, &re)
}

// redial checks, the hook removed, that a fresh Dial reaches the listener
// (or, where the listener failed, a new one on the same address) and
// carries a message each way; it closes everything it made and l.
func (s *eaEnv) redial(l *cm.Listener) {
	t := s.t
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if l == nil || s.listenerFailed.Load() {
		addr := netip.AddrPortFrom(s.ip, 0)
		if l != nil {
			if a, ok := l.Addr().(cm.Addr); ok {
				addr = a.AddrPort
			}
			l.Close()
		}
		var err error
		if l, err = cm.Listen(ctx, addr.String()); err != nil {
			t.Errorf("a new listener on %v after the failure: %v", addr, err)
			return
		}
	}
	defer l.Close()
	accepted := make(chan *cm.Conn, 1)
	go func() {
		c, err := l.Accept(ctx)
		if err != nil {
			accepted <- nil
			return
		}
		accepted <- c
	}()
	c, err := cm.Dial(ctx, l.Addr().String())
	if err != nil {
		t.Errorf("a fresh Dial after the failure: %v", err)
		l.Close()
		if a := <-accepted; a != nil {
			a.Close()
		}
		return
	}
	defer c.Close()
	a := <-accepted
	if a == nil {
		t.Errorf("a fresh Dial after the failure: the listener accepted nothing")
		return
	}
	defer a.Close()
	for _, dir := range []struct {
		from, to *cm.Conn
		msg      string
	}{{c, a, "later"}, {a, c, "later back"}} {
		if err := dir.from.Send(ctx, []byte(dir.msg)); err != nil {
			t.Errorf("a fresh connection after the failure: Send: %v", err)
			return
		}
		buf := make([]byte, 64)
		n, err := dir.to.Recv(ctx, buf)
		if err != nil || string(buf[:n]) != dir.msg {
			t.Errorf("a fresh connection after the failure: Recv %q, %v; want %q", buf[:n], err, dir.msg)
			return
		}
	}
}

// eaRun runs the scenario once with the hook h, checks it, redials and
// checks that nothing leaked.
func eaRun(t *testing.T, ip netip.Addr, dev string, h *eaHook) {
	base := baseline(t, dev)
	s := &eaEnv{t: t, h: h, ip: ip}
	unset := faults.Set(h.check)
	defer unset()
	h.armed.Store(true)
	l := s.eaScenario(base)
	h.armed.Store(false)
	unset()
	s.mu.Lock()
	for _, hang := range s.hangs {
		t.Error(hang)
	}
	s.mu.Unlock()
	if h.n > 0 {
		s.check(h.op)
		if !h.didFire() {
			t.Logf("no fault: the run made fewer %s calls than the counting run", h.op)
		}
	} else {
		s.mu.Lock()
		for _, c := range s.calls {
			t.Errorf("with no fault: %s: %v", c.call, c.err)
		}
		s.mu.Unlock()
	}
	if s.hung.Load() {
		// A call still under way holds what the checks below would
		// report; what hangs is the finding.
		if l != nil {
			l.Close()
		}
		t.FailNow()
	}
	s.redial(l)
	waitObjects(t, base, 20*time.Second)
}

// TestCMErrorAnywhere: every set-up and tear-down C call that cm's RC path
// makes (eaErrFor: CM ids, resolution, bind, listen, connect, accept,
// establish, disconnect; PD, completion channel, CQ, QP, QP moves, memory
// registration) can fail as a device fails it, and what follows is a clear
// error, no hang, nothing leaked and a listener and dialer that still work.
// A counting run of the scenario (eaScenario: Listen, an Accept loop, Dial,
// one message each way, Close both) counts each op's calls (the listener's
// and the dialer's together, in one process); then for each op and each n
// up to eaMaxN of its count, a run fails the n-th call with eaErrFor's
// errno (the subtest op/n). Every run checks: no call outlives its 10 s
// context by 3 s; every error a call returns is the injected errno naming
// its C call, or one of cm's errors (ErrPeerGone, ErrClosed, ...), a
// refusal (ECONNREFUSED), or another C call's error, never a context's;
// with the hook removed, a fresh Dial to the listener (a new one on the
// same address where it failed) carries a message each way; and once all
// is closed, nothing is left over the test's start (waitObjects: QPs, CQs,
// MRs, PDs, CM ids, goroutines, in the bindings' counters and the
// kernel's). Which call is the n-th may vary a little between runs with the
// interleaving of the listener's and the dialer's goroutines.
func TestCMErrorAnywhere(t *testing.T) {
	dev, ip := softroce.Device(t)
	cnt := newEAHook("", 0)
	eaRun(t, ip, dev, cnt)
	if t.Failed() {
		t.Fatal("the scenario fails with no fault")
	}
	ops := slices.Sorted(maps.Keys(eaErrFor))
	var counts []string
	for _, op := range ops {
		counts = append(counts, fmt.Sprintf("%s %d", op, cnt.count(op)))
	}
	t.Logf("calls: %s", strings.Join(counts, ", "))
	for _, op := range ops {
		for n := 1; n <= min(cnt.count(op), eaMaxN); n++ {
			t.Run(fmt.Sprintf("%s/%d", op, n), func(t *testing.T) {
				eaRun(t, ip, dev, newEAHook(op, n))
			})
		}
	}
}
