package xrc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// Config's documented defaults: Heartbeat, IdleTimeout and HandshakeTimeout
// of 0 or less are their Default*, RecvWindow 0 is DefaultRecvWindow (the
// credits the peer's sender starts with), MaxMessageSize 0 is
// MaxMessageSize (what Conn.MaxRecvSize says here and the peer's
// Conn.MaxMessageSize there), an IdleTimeout under 2 Heartbeats is raised to
// 2 Heartbeats, and DomainDir "" is goxrc-<euid> in the system temporary
// directory.
func TestDocConfigDefaults(t *testing.T) {
	w := newWorld(t)
	t.Setenv("TMPDIR", t.TempDir())
	zero := func(c *Config) {
		c.Heartbeat, c.IdleTimeout, c.HandshakeTimeout, c.RecvWindow, c.MaxMessageSize = 0, 0, 0, 0, 0
	}
	a := w.endpoint("10.0.91.1", 7000, zero)
	if a.cfg.Heartbeat != DefaultHeartbeat || a.cfg.IdleTimeout != DefaultIdleTimeout ||
		a.cfg.HandshakeTimeout != DefaultHandshakeTimeout || a.cfg.RecvWindow != DefaultRecvWindow ||
		a.cfg.MaxMessageSize != MaxMessageSize {
		t.Errorf("zero Config: %+v", a.cfg)
	}
	neg := w.endpoint("10.0.91.3", 7000, func(c *Config) {
		c.Heartbeat, c.IdleTimeout, c.HandshakeTimeout = -1, -1, -1
	})
	if neg.cfg.Heartbeat != DefaultHeartbeat || neg.cfg.IdleTimeout != DefaultIdleTimeout ||
		neg.cfg.HandshakeTimeout != DefaultHandshakeTimeout {
		t.Errorf("negative durations: %+v", neg.cfg)
	}
	raised := w.endpoint("10.0.91.4", 7000, func(c *Config) {
		c.Heartbeat, c.IdleTimeout = 300*time.Millisecond, 100*time.Millisecond
	})
	if raised.cfg.IdleTimeout != 600*time.Millisecond {
		t.Errorf("IdleTimeout under 2 Heartbeats: %v, want 600ms", raised.cfg.IdleTimeout)
	}
	small := w.endpoint("10.0.91.2", 7000, func(c *Config) { c.MaxMessageSize = 4096 })
	ca, cs := pair(t, a, small)
	if ca.MaxRecvSize() != MaxMessageSize || ca.MaxMessageSize() != 4096 ||
		cs.MaxRecvSize() != 4096 || cs.MaxMessageSize() != MaxMessageSize {
		t.Errorf("sizes: a recv %d send %d; small recv %d send %d",
			ca.MaxRecvSize(), ca.MaxMessageSize(), cs.MaxRecvSize(), cs.MaxMessageSize())
	}
	small.mu.Lock()
	win := cs.sendWindow
	small.mu.Unlock()
	if win != DefaultRecvWindow {
		t.Errorf("the peer's sender starts with %d credits, want DefaultRecvWindow", win)
	}
	ca.Close()
	cs.Close()

	// DomainDir "": goxrc-<euid> in os.TempDir (TMPDIR here).
	p := w.f.Node("10.0.91.5").Process()
	e, err := NewEndpoint(context.Background(), Config{Process: p, Addr: "10.0.91.5:7000"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	want := filepath.Join(os.TempDir(), fmt.Sprintf("goxrc-%d", os.Geteuid()), DomainFileName)
	if e.dom.Path != want {
		t.Errorf("default domain file %q, want %q", e.dom.Path, want)
	}
}

// Config's documented ranges, each outside one matching ErrInvalid:
// RecvWindow at most 65535 (and not negative), MaxMessageSize from
// MinMessageSize up to MaxMessageSize.
func TestDocConfigRanges(t *testing.T) {
	w := newWorld(t)
	for i, tc := range []struct {
		window, size int
		ok           bool
	}{
		{65535, 0, true},
		{65536, 0, false},
		{-1, 0, false},
		{0, MinMessageSize, true},
		{0, MinMessageSize - 1, false},
		{0, -1, false},
		{0, MaxMessageSize + 1, false},
	} {
		ip := fmt.Sprintf("10.0.92.%d", i+1)
		e, err := NewEndpoint(context.Background(), Config{Process: w.f.Node(ip).Process(), Addr: ip + ":7000",
			DomainDir: t.TempDir() + "/d", RecvWindow: tc.window, MaxMessageSize: tc.size})
		switch {
		case tc.ok && err != nil:
			t.Errorf("RecvWindow %d, MaxMessageSize %d: %v", tc.window, tc.size, err)
		case !tc.ok && !errors.Is(err, ErrInvalid):
			t.Errorf("RecvWindow %d, MaxMessageSize %d: %v, want ErrInvalid", tc.window, tc.size, err)
		}
		if e != nil {
			e.Close()
		}
	}
}

// Endpoint.Err: nil while the endpoint works, ErrClosed after Close. Close
// is idempotent: concurrent calls each return once everything is released
// (the process holds no kernel handle).
func TestDocEndpointErrAndConcurrentClose(t *testing.T) {
	w := newWorld(t)
	a, b := w.endpoint("10.0.93.1", 7000), w.endpoint("10.0.93.2", 7000)
	ca, cb := pair(t, a, b)
	roundTrip(t, ca, cb, []byte("x"))
	if err := a.Err(); err != nil {
		t.Fatalf("Err of a working endpoint: %v", err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := a.Close(); err != nil {
				errs <- err
				return
			}
			if h := a.p.Handles(); h != 0 {
				errs <- fmt.Errorf("a Close returned with %d kernel handles held", h)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if err := a.Err(); err != ErrClosed {
		t.Errorf("Err after Close: %v, want ErrClosed", err)
	}
	// Conn.Close is idempotent too, and returns nil on a closed endpoint's
	// connection.
	for range 2 {
		if err := ca.Close(); err != nil {
			t.Errorf("Conn.Close: %v", err)
		}
	}
}

// Recv returns a queued message whether or not ctx has ended, and ctx's
// error only when it has to wait.
func TestDocRecvQueuedWithEndedContext(t *testing.T) {
	w := newWorld(t)
	a, b := w.endpoint("10.0.94.1", 7000), w.endpoint("10.0.94.2", 7000)
	ca, cb := pair(t, a, b)
	if err := ca.Send(ctxT(t, 5*time.Second), []byte("queued")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the message queued", func() (bool, string) {
		b.mu.Lock()
		defer b.mu.Unlock()
		return cb.q.Len() == 1, fmt.Sprint(cb.q.Len())
	})
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	buf := make([]byte, 16)
	if n, err := cb.Recv(ended, buf); err != nil || string(buf[:n]) != "queued" {
		t.Fatalf("Recv of a queued message with an ended context: %q, %v", buf[:n], err)
	}
	if _, err := cb.Recv(ended, buf); !errors.Is(err, context.Canceled) {
		t.Fatalf("Recv with nothing queued and an ended context: %v", err)
	}
	ca.Close()
	if _, err := cb.Recv(ctxT(t, 5*time.Second), buf); err != io.EOF {
		t.Fatalf("Recv after the peer's Close: %v, want io.EOF", err)
	}
	cb.Close()
}

// ResumeAccepting returns the current term when the endpoint accepts (Term's),
// and a new one after StopAccepting, which Term then returns; StopAccepting
// is idempotent.
func TestDocResumeAcceptingTerm(t *testing.T) {
	w := newWorld(t)
	a := w.endpoint("10.0.95.1", 7000)
	cur := a.Term()
	if got := a.ResumeAccepting(); got != cur {
		t.Fatal("ResumeAccepting while accepting: a new term")
	}
	a.StopAccepting()
	a.StopAccepting()
	if a.Term() != cur {
		t.Fatal("StopAccepting made a new term")
	}
	if _, err := a.AcceptIn(context.Background(), cur); !errors.Is(err, ErrClosed) {
		t.Fatalf("AcceptIn(ended term): %v", err)
	}
	next := a.ResumeAccepting()
	if next == cur || a.Term() != next {
		t.Fatal("ResumeAccepting after StopAccepting: not a new current term")
	}
}

// After the device fails (DEVICE_FATAL: ErrDeviceRemoved), every
// connection fails with ErrDeviceRemoved, Accept and Dial return it, and
// the endpoint closes itself: calls made after that self-Close still say
// ErrDeviceRemoved (Conn.Err, Send, Recv, CloseWrite, Endpoint.Err).
func TestDocDeviceLossEveryCallSaysSo(t *testing.T) {
	w := newWorld(t)
	s, r := w.endpoint("10.0.96.1", 7000), w.endpoint("10.0.96.2", 7000)
	sc, rc := pair(t, s, r)
	roundTrip(t, sc, rc, []byte("x"))
	w.f.Node("10.0.96.1").FailDevice()
	eventually(t, "the endpoint released everything", func() (bool, string) {
		return s.p.Handles() == 0, fmt.Sprint(s.p.Handles())
	})
	ctx := ctxT(t, 5*time.Second)
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, ErrDeviceRemoved) {
			t.Errorf("%s: %v, want ErrDeviceRemoved", what, err)
		}
	}
	check("Conn.Err", sc.Err())
	check("Send", sc.Send(ctx, []byte("y")))
	_, err := sc.Recv(ctx, make([]byte, 8))
	check("Recv", err)
	check("CloseWrite", sc.CloseWrite())
	_, err = s.Accept(ctx)
	check("Accept", err)
	_, err = s.Dial(ctx, r.Addr().String())
	check("Dial", err)
	check("Endpoint.Err", s.Err())
	s.Close()
	check("Endpoint.Err after Close", s.Err())
	rc.Close()
}

// Endpoint.Err after its process died (kill -9): the cause (the kernel's
// error), not nil nor Close's bare ErrClosed, before and after Close;
// Accept returns it too.
func TestDocEndpointErrAfterProcessDied(t *testing.T) {
	w := newWorld(t)
	a := w.endpoint("10.0.98.1", 7000)
	a.p.Kill()
	eventually(t, "Err reports the process's death", func() (bool, string) {
		err := a.Err()
		return err != nil, fmt.Sprint(err)
	})
	cause := a.Err()
	if cause == ErrClosed {
		t.Fatalf("Err after the process died: %v, want its cause", cause)
	}
	if _, err := a.Accept(ctxT(t, time.Second)); !errors.Is(err, cause) {
		t.Fatalf("Accept: %v, want %v", err, cause)
	}
	a.Close()
	if err := a.Err(); err != cause {
		t.Fatalf("Err after Close: %v, want %v", err, cause)
	}
}

// StopAccepting keeps the port bound: another endpoint cannot take it.
func TestDocStopAcceptingKeepsPort(t *testing.T) {
	w := newWorld(t)
	a := w.endpoint("10.0.99.1", 7000)
	a.StopAccepting()
	e, err := NewEndpoint(context.Background(), Config{Process: w.f.Node("10.0.99.1").Process(),
		Addr: a.Addr().String(), DomainDir: w.dirs["10.0.99.1"]})
	if err == nil {
		e.Close()
		t.Fatal("a second endpoint took the port of one that stopped accepting")
	}
}

// A connection outlives the contexts of the Dial and the Accept that made
// it: they bound the setup only.
func TestDocConnOutlivesDialAndAcceptContexts(t *testing.T) {
	w := newWorld(t)
	a, b := w.endpoint("10.0.100.1", 7000), w.endpoint("10.0.100.2", 7000)
	actx, acancel := context.WithCancel(context.Background())
	type res struct {
		c   *Conn
		err error
	}
	ch := make(chan res, 1)
	go func() { c, err := b.Accept(actx); ch <- res{c, err} }()
	dctx, dcancel := context.WithCancel(context.Background())
	ca, err := a.Dial(dctx, b.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	r := <-ch
	if r.err != nil {
		t.Fatal(r.err)
	}
	dcancel()
	acancel()
	time.Sleep(3 * testHeartbeat)
	for i := range 3 {
		roundTrip(t, ca, r.c, []byte(fmt.Sprint("to b ", i)))
		roundTrip(t, r.c, ca, []byte(fmt.Sprint("to a ", i)))
	}
	if ca.Err() != nil || r.c.Err() != nil {
		t.Fatalf("Err: %v / %v", ca.Err(), r.c.Err())
	}
	ca.Close()
	r.c.Close()
}

// ResumeAccepting on a DialOnly endpoint: it still refuses new inbound
// connections (APP_REJECT).
func TestDocResumeAcceptingDialOnly(t *testing.T) {
	w := newWorld(t)
	d := w.endpoint("10.0.102.1", 7000, func(c *Config) { c.DialOnly = true })
	b := w.endpoint("10.0.102.2", 7000)
	d.StopAccepting()
	d.ResumeAccepting()
	_, err := b.Dial(ctxT(t, 5*time.Second), d.Addr().String())
	var rj *RejectError
	if !errors.As(err, &rj) || rj.Reason != RejectApp {
		t.Fatalf("dial into a DialOnly endpoint after ResumeAccepting: %v, want APP_REJECT", err)
	}
}
