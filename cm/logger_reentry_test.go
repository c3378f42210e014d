package cm

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/internal/fakedns"
	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/verbs"
)

// callbackHandler is a WithLogger handler that calls back into cm for every
// record before it keeps the record's message, as a handler that adds the
// connection's Stats to each line does (or one that closes the connection
// on a failure).
type callbackHandler struct {
	call func()
	mu   *sync.Mutex
	msgs *[]string
}

func newCallbackHandler(call func()) callbackHandler {
	return callbackHandler{call: call, mu: new(sync.Mutex), msgs: new([]string)}
}

func (h callbackHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h callbackHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h callbackHandler) WithGroup(string) slog.Handler            { return h }
func (h callbackHandler) Handle(_ context.Context, r slog.Record) error {
	h.call()
	h.mu.Lock()
	*h.msgs = append(*h.msgs, r.Level.String()+": "+r.Message)
	h.mu.Unlock()
	return nil
}

func (h callbackHandler) logged() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), *h.msgs...)
}

// useLogger gives c the logger of WithLogger(slog.New(h)), as Dial and
// Accept do (config.params).
func useLogger(t *testing.T, c *Conn, h slog.Handler) {
	t.Helper()
	cfg, err := newConfig([]Option{WithLogger(slog.New(h))})
	require.NoError(t, err)
	p := cfg.params(0, 0)
	c.log, c.logInfo = p.log, p.logInfo
}

// within runs f and fails the test, with every goroutine's stack, if it has
// not returned after d: a deadlock is the failure. The goroutines stuck on
// the Conn's lock would also hang the cleanups' Close, which a test's panic
// runs: the panic is a goroutine's of its own, which ends the test binary.
func within(t *testing.T, d time.Duration, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	select {
	case <-done:
	case <-time.After(d):
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		fmt.Fprintf(os.Stderr, "%s: goroutines:\n%s\n", t.Name(), buf)
		go panic(t.Name() + ": deadlock: a logger's handler that calls back into cm never returned")
		select {}
	}
}

// A handler that reads the connection's Stats, its addresses and the
// process's Stats for every record: "connection failed" was logged under
// the Conn's lock, which Stats takes, so every failure path of an RC
// connection deadlocked: the failing call, the reaper and every later call
// (Close included) waited for the lock for ever.
func TestLoggerHandlerCallsBackOnFailures(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts fakeOpts
		// breaks a's connection and returns the failure a's calls see.
		run     func(t *testing.T, a, b *Conn, w *fakeWire) error
		wantErr error
		want    []string
	}{
		{"peer death", fakeOpts{}, func(t *testing.T, a, b *Conn, w *fakeWire) error {
			w.ends[1].shutdown()
			a.peerGone("peer disconnected") // the CM watcher's call: its round logs
			_, err := a.Recv(ctxT(t), make([]byte, 64))
			return err
		}, ErrPeerGone, []string{"WARN: connection failed"}},
		{"protocol error", fakeOpts{}, func(t *testing.T, a, b *Conn, w *fakeWire) error {
			w.mu.Lock()
			w.ends[1].corrupt = func(imm uint32) uint32 { return imm ^ 1 }
			w.mu.Unlock()
			require.NoError(t, b.Send(ctxT(t), []byte("garbled")))
			_, err := a.Recv(ctxT(t), make([]byte, 64))
			return err
		}, ErrProtocol, []string{"WARN: connection failed"}},
		{"keepalive", fakeOpts{keepalive: 5 * time.Millisecond}, func(t *testing.T, a, b *Conn, w *fakeWire) error {
			w.mu.Lock()
			w.ends[1].shut = true // b's node vanishes: only a's probe tells
			w.mu.Unlock()
			_, err := a.Recv(ctxT(t), make([]byte, 64))
			return err
		}, ErrPeerGone, []string{"WARN: connection failed"}},
		{"device events", fakeOpts{}, func(t *testing.T, a, b *Conn, w *fakeWire) error {
			a.asyncEvent(verbs.AsyncEvent{Type: verbs.EventPortErr, Port: 1})
			a.asyncEvent(verbs.AsyncEvent{Type: verbs.EventPortActive, Port: 1})
			a.asyncEvent(verbs.AsyncEvent{Type: verbs.EventQPFatal, QPNum: 17})
			_, err := a.Recv(ctxT(t), make([]byte, 64))
			return err
		}, ErrPeerGone, []string{
			"WARN: RDMA port down: the connection fails unless the port comes back before the transport's retries run out",
			"INFO: RDMA port active", "WARN: connection failed",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b, w := fakePair(t, tc.opts)
			h := newCallbackHandler(func() {
				_ = a.Stats()
				_ = GlobalStats()
				_, _ = a.LocalAddr(), a.RemoteAddr()
			})
			useLogger(t, a, h)
			var err error
			within(t, 10*time.Second, func() { err = tc.run(t, a, b, w) })
			require.ErrorIs(t, err, tc.wantErr)
			within(t, 10*time.Second, func() { require.NoError(t, a.Close()) })
			require.Equal(t, uint64(1), a.Stats().Errors)
			require.Equal(t, tc.want, h.logged())
		})
	}
}

// A handler that closes the connection on its failure: the round that
// takes the peer's death in (the CM watcher's, here) logs once it has let
// go of the connection, so the Close runs; it waited for the Conn's lock,
// held by its own goroutine. (A Close from a handler cannot run everywhere:
// see WithLogger.)
func TestLoggerHandlerClosesOnFailure(t *testing.T) {
	a, b, w := fakePair(t, fakeOpts{})
	var closeErr error
	h := newCallbackHandler(func() { closeErr = a.Close() })
	useLogger(t, a, h)
	require.NoError(t, b.Send(ctxT(t), []byte("last words")))
	within(t, 10*time.Second, func() {
		w.ends[1].shutdown()
		a.peerGone("peer disconnected")
	})
	require.NoError(t, closeErr)
	require.Equal(t, []string{"WARN: connection failed"}, h.logged())
	_, err := a.Recv(ctxT(t), make([]byte, 64))
	require.ErrorIs(t, err, ErrPeerGone, "closed after the failure: the failure stays")
}

// Over XRC on the in-memory fabric, where the logger sees the choice of
// transport and a name's failed addresses only (WithLogger): a Dial of a name whose first address refuses, and an
// XRCPrefer Dial's fallback to RC (logged, then remembered), with a
// handler that reads the listener's address, the process's Stats (every
// XRC endpoint's Stats) and a connection's, and closes another connection.
// These records are logged holding none of cm's locks: it passed before
// the fix too, and guards that.
func TestLoggerHandlerCallsBackOverXRC(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	f := newFabric(t)
	server, client := f.Node("10.1.0.1"), f.Node("10.1.0.2")
	f.Node("10.1.0.3") // a node where nothing listens
	dir := t.TempDir()
	l, err := Listen(ctx, "10.1.0.1:7000", WithFabric(server.Process()), WithDomainPath(filepath.Join(dir, "l")))
	require.NoError(t, err)
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept(ctx)
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	var read, victim atomic.Pointer[Conn]
	h := newCallbackHandler(func() {
		_ = l.Addr()
		_ = GlobalStats()
		if c := read.Load(); c != nil {
			_ = c.Stats()
		}
		if c := victim.Swap(nil); c != nil {
			_ = c.Close()
		}
	})
	proc := client.Process()
	opts := []Option{WithFabric(proc), WithDomainPath(filepath.Join(dir, "c")), WithLogger(slog.New(h))}
	within(t, 15*time.Second, func() {
		c1, err := Dial(ctx, "10.1.0.1:7000", opts...)
		require.NoError(t, err)
		defer c1.Close()
		read.Store(c1)
		c2, err := Dial(ctx, "10.1.0.1:7000", opts...)
		require.NoError(t, err)
		defer c2.Close()
		victim.Store(c2)

		r := fakedns.Resolver(map[string][]netip.Addr{"server.test": {
			netip.MustParseAddr("10.1.0.3"), netip.MustParseAddr("10.1.0.1"),
		}})
		c3, err := Dial(ctx, "server.test:7000", append(opts, WithResolver(r))...)
		require.NoError(t, err, "the second address listens")
		defer c3.Close()
		require.ErrorIs(t, c2.Send(ctx, []byte("x")), ErrClosed, "the handler closed it")

		rc := netip.MustParseAddrPort("10.1.0.1:7471")
		rawListener(t, server.Process(), rc, kernel.ExchangeRC)
		cfg, err := newConfig(append(opts, WithXRC(XRCPrefer)))
		require.NoError(t, err)
		site := cfg.fabricSite(client.Addr())
		for range 2 { // refused, then remembered
			c, useRC, err := dialXRCPrefer(ctx, rc, cfg, site)
			require.NoError(t, err)
			require.Nil(t, c)
			require.True(t, useRC)
		}
		require.NoError(t, c1.Close())
	})
	require.Equal(t, []string{
		"INFO: dial: an address of the name failed",
		"INFO: XRC unavailable, using RC",
		"DEBUG: XRC refused by the peer's CM recently, using RC",
	}, h.logged())
}
