package cm

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/xrc"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// Pins of the option and error promises of the docs that an audit of the
// docs against the code found no test for (docaudit: claim by claim).

// An option out of range fails Dial and Listen with ErrInvalid in an
// *OpError naming the call, and a message naming the option, before the
// address is looked up or anything is opened: nothing is left behind
// (listeners, connections, XRC handles, goroutines), and on a host without
// RDMA the device path says the same as the fabric's.
func TestDocOptionOutOfRangeTypedAndNothingLeaked(t *testing.T) {
	ctx := ctxT(t)
	f := newFabric(t)
	srv := f.Node("10.1.0.1").Process()
	dom := WithDomainPath(filepath.Join(t.TempDir(), "xrc"))
	for _, tc := range []struct {
		name, says string
		opt        Option
	}{
		{"depth 0", "queue depth 0", WithQueueDepth(0)},
		{"depth 1", "queue depth 1", WithQueueDepth(1)},
		{"depth -1", "queue depth -1", WithQueueDepth(-1)},
		{"depth huge", "queue depth", WithQueueDepth(math.MaxInt)},
		{"size 0", "message size 0", WithMessageSize(0)},
		{"size -1", "message size -1", WithMessageSize(-1)},
		{"size 1 GiB + 1", "message size", WithMessageSize(1<<30 + 1)},
		{"size huge", "message size", WithMessageSize(math.MaxInt)},
		{"inline -1", "inline threshold", WithInlineThreshold(-1)},
		{"handshake 0", "handshake timeout", WithHandshakeTimeout(0)},
		{"handshake -1ns", "handshake timeout", WithHandshakeTimeout(-1)},
		{"keepalive -1s", "keepalive", WithKeepalive(-time.Second)},
		{"busy poll -1ns", "busy-poll", WithBusyPoll(-1)},
		{"backlog -1", "backlog", WithBacklog(-1)},
		{"XRC mode 9", "XRC mode", WithXRC(XRCMode(9))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := GlobalStats()
			for _, opts := range [][]Option{{WithFabric(srv), dom, tc.opt}, {tc.opt}} {
				_, err := Dial(ctx, "10.1.0.1:7471", opts...)
				var oe *OpError
				require.ErrorAs(t, err, &oe)
				require.Equal(t, "dial", oe.Op)
				require.ErrorIs(t, err, ErrInvalid)
				require.Contains(t, err.Error(), tc.says)
				l, err := Listen(ctx, "10.1.0.1:0", opts...)
				require.Nil(t, l)
				require.ErrorAs(t, err, &oe)
				require.Equal(t, "listen", oe.Op)
				require.ErrorIs(t, err, ErrInvalid)
				require.Contains(t, err.Error(), tc.says)
			}
			after := GlobalStats()
			require.Equal(t, before.Listeners, after.Listeners)
			require.Equal(t, before.ConnectionsOpen, after.ConnectionsOpen)
			require.Equal(t, before.QueuePairs, after.QueuePairs)
			require.Equal(t, before.Devices, after.Devices)
			require.Equal(t, before.XRCKernelHandles, after.XRCKernelHandles)
			require.Equal(t, before.XRCQueuePairs, after.XRCQueuePairs)
			require.Equal(t, before.DialErrors+2, after.DialErrors, "every failed Dial counts")
		})
	}
}

// What the docs leave in range is taken: an inline threshold above the
// message size (the device lowers what it cannot inline; a message is
// never longer than the size), and, over the fabric, where WithInlineThreshold
// and WithBacklog have no effect, a huge threshold and a backlog of 0.
// WithMessageSize(1 GiB), cm's largest, is capped at the engine's 1 MiB.
func TestDocInRangeExtremesTaken(t *testing.T) {
	for _, opts := range [][]Option{
		{WithInlineThreshold(1 << 20), WithMessageSize(64)},
		{WithInlineThreshold(math.MaxInt)},
		{WithBacklog(0)},
		{WithQueueDepth(maxQueueDepth), WithMessageSize(maxMessageSize)},
	} {
		_, err := newConfig(opts)
		require.NoError(t, err)
	}
	ctx := ctxT(t)
	f := newFabric(t)
	opts := []Option{WithInlineThreshold(math.MaxInt), WithMessageSize(1 << 30), WithBacklog(0)}
	c, s := fabricPair(ctx, t, f.Node("10.1.0.1").Process(), f.Node("10.1.0.2").Process(), opts, opts)
	require.Equal(t, 1<<20, c.MaxMessageSize())
	require.Equal(t, 1<<20, s.MaxRecvSize())
	big := make([]byte, 1<<20)
	big[len(big)-1] = 7
	require.NoError(t, c.Send(ctx, big))
	got := make([]byte, s.MaxRecvSize())
	n, err := s.Recv(ctx, got)
	require.NoError(t, err)
	require.Equal(t, len(big), n)
	require.Equal(t, byte(7), got[n-1])
}

// WithQueueDepth's extremes over XRC: a receiver holds exactly depth
// messages Recv has not taken, and the sender waits for the next (2, the
// least, and 4000, the most).
func TestDocFabricQueueDepthExtremes(t *testing.T) {
	for _, depth := range []int{minQueueDepth, maxQueueDepth} {
		ctx := ctxT(t)
		f := newFabric(t)
		opts := []Option{WithQueueDepth(depth), WithMessageSize(64)}
		c, s := fabricPair(ctx, t, f.Node("10.1.0.1").Process(), f.Node("10.1.0.2").Process(), opts, opts)
		for i := range depth {
			require.NoError(t, c.Send(ctx, []byte{byte(i)}), "message %d of %d", i, depth)
		}
		short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		err := c.Send(short, []byte("one too many"))
		cancel()
		require.ErrorIs(t, err, context.DeadlineExceeded, "depth %d", depth)
		buf := make([]byte, 64)
		for i := range depth {
			n, err := s.Recv(ctx, buf)
			require.NoError(t, err)
			require.Equal(t, []byte{byte(i)}, buf[:n])
		}
		require.NoError(t, c.Send(ctx, []byte("now")))
	}
}

// Close is idempotent on a Conn and a Listener (nil both times), and the
// net.Conn adapter's errors are *net.OpError values naming the operation:
// "set" for a deadline set after Close, "read" and "write" after it, each
// wrapping net.ErrClosed; "close" for CloseWrite. RC (the fake) and XRC.
func TestDocCloseIdempotentAndNetConnOps(t *testing.T) {
	for _, tr := range confTransports {
		t.Run(tr.name, func(t *testing.T) {
			p := tr.pair(t)
			nc := p.a.NetConn()
			require.NoError(t, nc.Close())
			require.NoError(t, nc.Close(), "the adapter's Close again")
			require.NoError(t, p.a.Close(), "Close after the adapter's")
			require.NoError(t, p.a.Close())
			check := func(op string, err error) {
				t.Helper()
				var ne *net.OpError
				require.ErrorAs(t, err, &ne, op)
				require.Equal(t, op, ne.Op)
				require.Equal(t, "rdma", ne.Net)
				require.ErrorIs(t, err, net.ErrClosed, op)
			}
			check("set", nc.SetDeadline(time.Now()))
			check("set", nc.SetReadDeadline(time.Now()))
			check("set", nc.SetWriteDeadline(time.Now()))
			_, err := nc.Read(make([]byte, 4))
			check("read", err)
			_, err = nc.Write([]byte("x"))
			check("write", err)
			cw := nc.(interface{ CloseWrite() error }).CloseWrite()
			check("close", cw)
		})
	}
	f := newFabric(t)
	l, err := Listen(ctxT(t), "10.1.7.1:0", WithFabric(f.Node("10.1.7.1").Process()), WithDomainPath(filepath.Join(t.TempDir(), "xrc")))
	require.NoError(t, err)
	before := GlobalStats().Listeners
	require.NoError(t, l.Close())
	require.NoError(t, l.Close())
	require.Equal(t, before-1, GlobalStats().Listeners, "a second Close counts nothing")
}

// A Send over MaxMessageSize is an *OpError "send" matching
// ErrMessageTooLong that says the limit, and sends nothing; a Recv buffer too
// short is one "recv" and keeps the message (RC and XRC).
func TestDocMessageTooLongTyped(t *testing.T) {
	for _, tr := range confTransports {
		t.Run(tr.name, func(t *testing.T) {
			p := tr.pair(t)
			m := p.a.MaxMessageSize()
			err := p.a.Send(p.ctx, make([]byte, m+1))
			var oe *OpError
			require.ErrorAs(t, err, &oe)
			require.Equal(t, "send", oe.Op)
			require.ErrorIs(t, err, ErrMessageTooLong)
			require.True(t, strings.Contains(err.Error(), "limit"), "%v", err)
			require.Zero(t, p.a.Stats().MessagesSent)
			require.NoError(t, p.a.Send(p.ctx, []byte("12345")))
			_, err = p.b.Recv(p.ctx, make([]byte, 4))
			require.ErrorAs(t, err, &oe)
			require.Equal(t, "recv", oe.Op)
			require.ErrorIs(t, err, ErrMessageTooLong)
			n, err := p.b.Recv(p.ctx, make([]byte, 8))
			require.NoError(t, err)
			require.Equal(t, 5, n)
			require.False(t, errors.Is(err, ErrPeerGone))
			require.Zero(t, p.a.Stats().Errors+p.b.Stats().Errors)
		})
	}
}

// injectWriteImm delivers on side's receive queue what a plain verbs peer's
// RDMA write with immediate data causes: a receive completion of the
// write's length, with the immediate, that filled no receive buffer.
func injectWriteImm(t *testing.T, w *fakeWire, side, n int, imm uint32) {
	t.Helper()
	e := w.ends[side]
	w.mu.Lock()
	defer w.mu.Unlock()
	require.NotEmpty(t, e.posted)
	slot := e.posted[0]
	e.posted = e.posted[1:]
	e.cq = append(e.cq, completion{op: compRecv, slot: slot, n: n, imm: imm, hasImm: true, written: true})
	e.signal()
}

// doc.go, "Interoperability": a raw peer's RDMA write with immediate data
// arrives as a message of no bytes carrying the immediate (RecvWithImm),
// and takes a receive buffer that goes back (the peer's next sends still
// arrive); a framed connection fails with ErrProtocol if its peer writes
// so, counted in Stats.Errors.
func TestDocRawWriteWithImmIsEmptyMessage(t *testing.T) {
	t.Run("raw", func(t *testing.T) {
		a, b, w := fakePair(t, fakeOpts{raw: true, depth: [2]int{2, 2}})
		ctx := ctxT(t)
		for i := range 5 { // more than b's receive buffers
			injectWriteImm(t, w, 1, 300, 0xabc0+uint32(i))
			n, imm, ok, err := b.RecvWithImm(ctx, make([]byte, 8))
			require.NoError(t, err)
			require.Zero(t, n, "the data is in the region the peer wrote")
			require.True(t, ok)
			require.Equal(t, 0xabc0+uint32(i), imm)
		}
		require.NoError(t, a.Send(ctx, []byte("after")))
		buf := make([]byte, 8)
		n, err := b.Recv(ctx, buf)
		require.NoError(t, err)
		require.Equal(t, "after", string(buf[:n]))
		require.Zero(t, b.Stats().Errors)
	})
	t.Run("framed", func(t *testing.T) {
		_, b, w := fakePair(t, fakeOpts{})
		ctx := ctxT(t)
		injectWriteImm(t, w, 1, 0, 1<<28)
		_, err := b.Recv(ctx, make([]byte, 8))
		require.ErrorIs(t, err, ErrProtocol)
		require.Equal(t, uint64(1), b.Stats().Errors)
	})
}

// requireSendsThenWaits checks that c sends n messages, the peer reading
// nothing, and that the next Send waits. Each of the n has the test's
// whole ctx: a short deadline for them took a Send slowed by a loaded
// machine for one that waits.
func requireSendsThenWaits(t *testing.T, ctx context.Context, c *Conn, n int, what string) {
	t.Helper()
	for i := range n {
		require.NoError(t, c.Send(ctx, []byte{byte(i)}), "%s: message %d of %d", what, i+1, n)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, c.Send(short, []byte{byte(n)}), context.DeadlineExceeded, "%s: message %d did not wait", what, n+1)
}

// DefaultQueueDepth's doc: "On RC a sender is held to the smaller of the
// two sides' depths; over XRC to its receiver's" (WithQueueDepth: over XRC
// it bounds one direction only, however deep the peer's own queue is).
func TestDocQueueDepthAsymmetric(t *testing.T) {
	t.Run("RC", func(t *testing.T) {
		a, b, _ := fakePair(t, fakeOpts{depth: [2]int{4, 10}})
		ctx := ctxT(t)
		requireSendsThenWaits(t, ctx, a, 4, "dialer (depth 4) to acceptor (depth 10)")
		requireSendsThenWaits(t, ctx, b, 4, "acceptor (depth 10) to dialer (depth 4)")
	})
	t.Run("XRC", func(t *testing.T) {
		ctx := ctxT(t)
		f := newFabric(t)
		c, s := fabricPair(ctx, t, f.Node("10.1.0.1").Process(), f.Node("10.1.0.2").Process(),
			[]Option{WithQueueDepth(10)}, []Option{WithQueueDepth(3)})
		requireSendsThenWaits(t, ctx, c, 10, "dialer (depth 3) to listener (depth 10)")
		requireSendsThenWaits(t, ctx, s, 3, "listener (depth 10) to dialer (depth 3)")
	})
}

// doc.go, "Errors and waiting": errors are *OpError values (net.Error),
// except a call on a nil Conn or Listener. Every call's error on a closed
// Conn, one whose peer is gone, and a closed Listener's Accept.
func TestDocErrorsAreOpErrors(t *testing.T) {
	for _, tr := range confTransports {
		t.Run(tr.name, func(t *testing.T) {
			p := tr.pair(t)
			ctx := p.ctx
			var r *Region
			if tr.name == "RC" {
				var err error
				r, err = p.a.RegisterMemory(64, RemoteRead|RemoteWrite)
				require.NoError(t, err)
				defer r.Close()
			}
			calls := func(c *Conn) map[string]error {
				_, rerr := c.Recv(ctx, make([]byte, 8))
				_, _, _, rierr := c.RecvWithImm(ctx, make([]byte, 8))
				_, regErr := c.RegisterMemory(64, RemoteRead)
				return map[string]error{
					"Send": c.Send(ctx, []byte("x")), "SendWithImm": c.SendWithImm(ctx, []byte("x"), 1),
					"Recv": rerr, "RecvWithImm": rierr, "CloseWrite": c.CloseWrite(), "RegisterMemory": regErr,
					"WriteRemote": c.WriteRemote(ctx, r, 0, 8, RemoteRegion{Len: 64}, 0),
					"ReadRemote":  c.ReadRemote(ctx, r, 0, 8, RemoteRegion{Len: 64}, 0),
				}
			}
			p.kill()
			p.settle()
			for _, c := range []*Conn{p.a, p.b} {
				for name, err := range calls(c) {
					require.Error(t, err, name)
					var oe *OpError
					require.ErrorAs(t, err, &oe, "%s: %v", name, err)
					var ne net.Error
					require.ErrorAs(t, err, &ne, name)
				}
				require.NoError(t, c.Close())
				for name, err := range calls(c) {
					var oe *OpError
					require.ErrorAs(t, err, &oe, "after Close, %s: %v", name, err)
				}
			}
		})
	}
}

// Conn.Close's doc: over XRC, Close is bounded by the handshake timeout as
// well; the package doc: the Close family takes no context and is bounded
// by the handshake timeout (and the CM's time-wait). A receiver whose
// process is stalled (its SRQ out of receives) holds the sender's messages
// uncompleted: the sender's Close returns within about the timeout.
func TestDocXRCCloseBoundedByHandshakeTimeout(t *testing.T) {
	ctx := ctxT(t)
	f := newFabric(t)
	f.AddNode("10.1.0.1", memfabric.NodeConfig{SRQReceives: 2})
	srv, cli := f.Node("10.1.0.1").Process(), f.Node("10.1.0.2").Process()
	const timeout = time.Second
	hs := WithHandshakeTimeout(timeout)
	c, s := fabricPair(ctx, t, srv, cli, []Option{hs, WithQueueDepth(16)}, []Option{hs})
	srv.PauseReceives()
	for i := range 8 {
		require.NoError(t, c.Send(ctx, []byte{byte(i)}))
	}
	start := time.Now()
	err := c.Close()
	took := time.Since(start)
	t.Logf("Close after %v: %v", took, err)
	require.Less(t, took, 3*timeout, "Close outlasted its bound")
	srv.ResumeReceives()
	buf := make([]byte, 64)
	for i := 0; ; i++ {
		n, err := s.Recv(ctx, buf)
		t.Logf("peer's Recv %d: %q %v", i, buf[:n], err)
		if err != nil {
			break
		}
	}
	t.Logf("peer stats %+v, closer stats %+v", s.Stats(), c.Stats())
}

// doc.go, "Errors and waiting": a refused dial matches ECONNREFUSED and
// wraps *xrc.RejectError with Reason NO_LISTENER where nothing listens; a
// request nobody answered wraps the same type, matches its errno
// (ETIMEDOUT, a Timeout) and not ECONNREFUSED.
func TestDocFabricRefusedAndUnansweredDials(t *testing.T) {
	ctx := ctxT(t)
	f := newFabric(t)
	cli := f.Node("10.1.0.2").Process()
	f.Node("10.1.0.1")
	dom := WithDomainPath(filepath.Join(t.TempDir(), "xrc"))
	_, err := Dial(ctx, "10.1.0.1:7471", WithFabric(cli), dom)
	require.ErrorIs(t, err, syscall.ECONNREFUSED)
	var re *xrc.RejectError
	require.ErrorAs(t, err, &re)
	require.Equal(t, xrc.RejectNoListener, re.Reason, "%v", err)
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	require.False(t, ne.Timeout())

	f.Node("10.1.0.3").PowerOff()
	// No deadline on ctx: the handshake timeout bounds the Dial.
	start := time.Now()
	_, err = Dial(context.Background(), "10.1.0.3:7471", WithFabric(cli), dom, WithHandshakeTimeout(time.Second))
	t.Logf("unanswered after %v: %v", time.Since(start), err)
	require.Error(t, err)
	require.Less(t, time.Since(start), 5*time.Second, "the handshake timeout bounds a Dial without a deadline")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.False(t, errors.Is(err, syscall.ECONNREFUSED), "%v", err)
	require.ErrorAs(t, err, &ne)
	require.True(t, ne.Timeout(), "%v", err)
}

// Send's doc: Send copies p, which the caller may reuse once it returns,
// also over XRC, where the engine keeps a message until its completion
// (doc.go): a receiver that takes nothing in holds the messages while the
// caller overwrites its buffer; each arrives as sent.
func TestDocSendCopiesWhileReceiverStalled(t *testing.T) {
	ctx := ctxT(t)
	f := newFabric(t)
	f.AddNode("10.1.0.1", memfabric.NodeConfig{SRQReceives: 2})
	srv, cli := f.Node("10.1.0.1").Process(), f.Node("10.1.0.2").Process()
	c, s := fabricPair(ctx, t, srv, cli, []Option{WithQueueDepth(16)}, nil)
	srv.PauseReceives()
	p := make([]byte, 8)
	for i := range 8 {
		copy(p, []byte{byte(i), byte(i), byte(i), byte(i), byte(i), byte(i), byte(i), byte(i)})
		require.NoError(t, c.Send(ctx, p))
		for j := range p {
			p[j] = 0xff
		}
	}
	time.Sleep(50 * time.Millisecond)
	srv.ResumeReceives()
	buf := make([]byte, 64)
	for i := range 8 {
		n, err := s.Recv(ctx, buf)
		require.NoError(t, err)
		require.Equal(t, bytes.Repeat([]byte{byte(i)}, 8), buf[:n], "message %d", i)
	}
}

// countingHandler counts the records logged through it.
type countingHandler struct{ n *atomic.Int64 }

func (h countingHandler) Enabled(context.Context, slog.Level) bool  { return true }
func (h countingHandler) Handle(context.Context, slog.Record) error { h.n.Add(1); return nil }
func (h countingHandler) WithAttrs([]slog.Attr) slog.Handler        { return h }
func (h countingHandler) WithGroup(string) slog.Handler             { return h }

// WithLogger's doc: nothing is logged per message (XRC; RC's Conn logs
// only through its failure and port events, pinned elsewhere).
func TestDocNothingLoggedPerMessage(t *testing.T) {
	ctx := ctxT(t)
	f := newFabric(t)
	var n atomic.Int64
	lg := WithLogger(slog.New(countingHandler{&n}))
	c, s := fabricPair(ctx, t, f.Node("10.1.0.1").Process(), f.Node("10.1.0.2").Process(), []Option{lg}, []Option{lg})
	before := n.Load()
	buf := make([]byte, 64)
	for i := range 200 {
		require.NoError(t, c.Send(ctx, []byte{byte(i)}))
		_, err := s.Recv(ctx, buf)
		require.NoError(t, err)
		require.NoError(t, s.Send(ctx, []byte{byte(i)}))
		_, err = c.Recv(ctx, buf)
		require.NoError(t, err)
	}
	require.Equal(t, before, n.Load(), "records logged while messages flowed")
}

// WithLogger's doc: over XRC neither a connection nor its failure is
// logged, where RC logs "connected" and the failure at Warn.
func TestDocXRCConnLogsNothing(t *testing.T) {
	ctx := ctxT(t)
	f := newFabric(t)
	var n atomic.Int64
	lg := WithLogger(slog.New(countingHandler{&n}))
	sp := f.Node("10.1.0.1").Process()
	c, _ := fabricPair(ctx, t, sp, f.Node("10.1.0.2").Process(), []Option{lg}, []Option{lg})
	sp.Kill()
	_, err := c.Recv(ctx, make([]byte, 64))
	require.ErrorIs(t, err, ErrPeerGone)
	require.Equal(t, uint64(1), c.Stats().Errors, "a failure, which RC would log")
	require.Zero(t, n.Load(), "records logged over XRC")
}
