package cm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Pins of promises of the package's doc comments that no other test
// checked (an audit of the exported docs against the code).

// Every option's default (the constants and the docs' "default") and both
// ends of its documented range; a value outside fails with ErrInvalid.
func TestDocOptionDefaultsAndBounds(t *testing.T) {
	c, err := newConfig(nil)
	require.NoError(t, err)
	require.Equal(t, DefaultQueueDepth, c.queueDepth)
	require.Equal(t, 64, DefaultQueueDepth)
	require.Equal(t, DefaultMessageSize, c.messageSize)
	require.Equal(t, 64<<10, DefaultMessageSize)
	require.Equal(t, DefaultInlineThreshold, c.inlineThreshold)
	require.Equal(t, DefaultHandshakeTimeout, c.handshakeTimeout)
	require.Equal(t, 30*time.Second, DefaultHandshakeTimeout)
	require.Equal(t, DefaultBusyPoll, c.busyPoll)
	require.Equal(t, 1024, c.backlog, "WithBacklog's default")
	require.Zero(t, c.keepalive, "WithKeepalive: 0, the default, disables it")
	require.Equal(t, XRCOff, c.xrc, "RC by default")
	require.NotNil(t, c.logger)
	c, err = newConfig([]Option{WithLogger(nil)})
	require.NoError(t, err)
	require.NotNil(t, c.logger, "WithLogger(nil) keeps the discarding default")

	for _, tc := range []struct {
		name string
		opt  Option
		ok   bool
	}{
		{"depth 2", WithQueueDepth(2), true},
		{"depth 4000", WithQueueDepth(4000), true},
		{"depth 4001", WithQueueDepth(4001), false},
		{"size 1", WithMessageSize(1), true},
		{"size 1 GiB", WithMessageSize(1 << 30), true},
		{"size 0", WithMessageSize(0), false},
		{"inline 0", WithInlineThreshold(0), true},
		{"handshake -1s", WithHandshakeTimeout(-time.Second), false},
		{"busy poll 0", WithBusyPoll(0), true},
		{"keepalive 0", WithKeepalive(0), true},
		{"backlog 0", WithBacklog(0), true},
		{"backlog 65535", WithBacklog(65535), true},
		{"backlog 65536", WithBacklog(65536), false},
		{"XRCRequire", WithXRC(XRCRequire), true},
		{"XRCMode(3)", WithXRC(XRCMode(3)), false},
		{"XRCMode(-1)", WithXRC(XRCMode(-1)), false},
	} {
		_, err := newConfig([]Option{tc.opt})
		if tc.ok {
			require.NoError(t, err, tc.name)
		} else {
			require.ErrorIs(t, err, ErrInvalid, tc.name)
		}
	}
}

// WithMessageSize over XRC: a size under 64 bytes receives 64, one over
// 1 MiB receives 1 MiB; MaxRecvSize and MaxMessageSize say what holds
// (MaxMessageSize the smaller of this side's size and what the peer
// receives), and a process's Dials whose sizes are raised alike share one
// dialer endpoint (the same LocalAddr).
func TestDocFabricMessageSizeRaisedAndCapped(t *testing.T) {
	ctx := ctxT(t)
	f := newFabric(t)
	srv, cli := f.Node("10.1.0.1").Process(), f.Node("10.1.0.2").Process()
	c, s := fabricPair(ctx, t, srv, cli, []Option{WithMessageSize(10)}, []Option{WithMessageSize(2 << 20)})
	require.Equal(t, 1<<20, c.MaxRecvSize(), "capped at 1 MiB")
	require.Equal(t, 64, s.MaxRecvSize(), "raised to 64 bytes")
	require.Equal(t, 64, c.MaxMessageSize(), "what the peer receives")
	require.Equal(t, 10, s.MaxMessageSize(), "this side's own size")
	require.ErrorIs(t, s.Send(ctx, make([]byte, 11)), ErrMessageTooLong)
	require.ErrorIs(t, c.Send(ctx, make([]byte, 65)), ErrMessageTooLong)
	require.NoError(t, c.Send(ctx, make([]byte, 64)))
	n, err := s.Recv(ctx, make([]byte, s.MaxRecvSize()))
	require.NoError(t, err)
	require.Equal(t, 64, n)

	// Two more Dials from one process, of 10 and 20 bytes: both receive
	// 64 bytes, and share one endpoint.
	l2, err := Listen(ctx, "10.1.0.1:0", WithFabric(srv), WithDomainPath(filepath.Join(t.TempDir(), "s")))
	require.NoError(t, err)
	defer l2.Close()
	other := f.Node("10.1.0.3").Process()
	dom := WithDomainPath(filepath.Join(t.TempDir(), "o"))
	d1, err := Dial(ctx, l2.Addr().String(), WithFabric(other), dom, WithMessageSize(10))
	require.NoError(t, err)
	defer d1.Close()
	d2, err := Dial(ctx, l2.Addr().String(), WithFabric(other), dom, WithMessageSize(20))
	require.NoError(t, err)
	defer d2.Close()
	require.Equal(t, d1.LocalAddr(), d2.LocalAddr(), "one shared dialer endpoint")
	require.Equal(t, 10, d1.MaxMessageSize())
	require.Equal(t, 20, d2.MaxMessageSize())
	require.Equal(t, 64, d1.MaxRecvSize())
	require.Equal(t, 64, d2.MaxRecvSize())
	for range 2 {
		a, err := l2.Accept(ctx)
		require.NoError(t, err)
		a.Close()
	}
}

// Over the fabric WithKeepalive, WithDevice, WithBusyPoll,
// WithInlineThreshold and WithBacklog have no effect (WithFabric's doc).
func TestDocFabricIgnoresDeviceOptions(t *testing.T) {
	ctx := ctxT(t)
	f := newFabric(t)
	opts := []Option{WithDevice("nosuchdevice"), WithKeepalive(time.Millisecond), WithBusyPoll(0),
		WithInlineThreshold(0), WithBacklog(0)}
	c, s := fabricPair(ctx, t, f.Node("10.1.0.1").Process(), f.Node("10.1.0.2").Process(), opts, opts)
	require.NoError(t, c.Send(ctx, []byte("hello")))
	n, err := s.Recv(ctx, make([]byte, 64))
	require.NoError(t, err)
	require.Equal(t, 5, n)
	time.Sleep(20 * time.Millisecond)
	require.Zero(t, c.Stats().Keepalives)
	require.Zero(t, s.Stats().Keepalives)
}

// Recv after Close returns ErrClosed also where messages, or the peer's
// end of stream, were still to be read (Close's doc), on RC and over XRC.
func TestDocRecvAfterCloseWithUnread(t *testing.T) {
	for _, tr := range parityTransports {
		for _, fin := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/fin=%v", tr.name, fin), func(t *testing.T) {
				p := tr.pair(t)
				require.NoError(t, p.b.Send(p.ctx, []byte("read")))
				require.NoError(t, p.b.Send(p.ctx, []byte("unread")))
				if fin {
					require.NoError(t, p.b.CloseWrite())
				}
				buf := make([]byte, 64)
				_, err := p.a.Recv(p.ctx, buf)
				require.NoError(t, err)
				time.Sleep(50 * time.Millisecond) // the rest comes in
				require.NoError(t, p.a.Close())
				for range 2 {
					_, err = p.a.Recv(p.ctx, buf)
					require.ErrorIs(t, err, ErrClosed)
					require.NotErrorIs(t, err, io.EOF)
				}
			})
		}
	}
}

// A Send or Recv that ctx ended sends nothing and takes nothing: the
// connection goes on, the message stays queued, and the Stats count only
// what went (Send's, Recv's and Stats' docs); a deadline matches both
// context.DeadlineExceeded and os.ErrDeadlineExceeded and is a Timeout.
// A Recv buffer too short leaves the message queued too.
func TestDocEndedCtxTakesNothing(t *testing.T) {
	for _, tr := range parityTransports {
		t.Run(tr.name, func(t *testing.T) {
			p := tr.pair(t)
			ended, cancel := context.WithTimeout(context.Background(), -1)
			cancel()
			err := p.a.Send(ended, []byte("not sent"))
			require.ErrorIs(t, err, context.DeadlineExceeded)
			require.ErrorIs(t, err, os.ErrDeadlineExceeded)
			var ne net.Error
			require.True(t, errors.As(err, &ne) && ne.Timeout())
			require.NoError(t, p.a.Send(p.ctx, []byte("sent")))
			time.Sleep(50 * time.Millisecond)
			buf := make([]byte, 64)
			_, err = p.b.Recv(ended, buf)
			require.ErrorIs(t, err, os.ErrDeadlineExceeded)
			_, err = p.b.Recv(p.ctx, buf[:2])
			require.ErrorIs(t, err, ErrMessageTooLong)
			n, err := p.b.Recv(p.ctx, buf)
			require.NoError(t, err)
			require.Equal(t, "sent", string(buf[:n]), "the only message, still queued")
			sa, sb := p.a.Stats(), p.b.Stats()
			require.Equal(t, uint64(1), sa.MessagesSent)
			require.Equal(t, uint64(4), sa.BytesSent)
			require.Equal(t, uint64(1), sb.MessagesReceived)
			require.Equal(t, uint64(4), sb.BytesReceived)
			require.Zero(t, sa.Errors)
			require.Zero(t, sb.Errors)
		})
	}
}

// CloseWrite wakes a Send blocked on credits (it returns ErrClosed) and
// does not wait for the peer, over XRC as on RC
// (TestCloseWriteWakesBlockedSend pins RC with no credit for the FIN).
func TestDocCloseWriteWakesBlockedSendParity(t *testing.T) {
	for _, tr := range parityTransports {
		t.Run(tr.name, func(t *testing.T) {
			p := tr.pair(t)
			errc := blockedSend(t, p)
			require.NoError(t, p.a.CloseWrite())
			select {
			case err := <-errc:
				require.ErrorIs(t, err, ErrClosed)
			case <-time.After(5 * time.Second):
				t.Fatal("a Send blocked on credits still waits 5 s after CloseWrite")
			}
			require.NoError(t, p.a.CloseWrite(), "idempotent")
			buf := make([]byte, 64)
			for range parityDepth {
				_, err := p.b.Recv(p.ctx, buf)
				require.NoError(t, err)
			}
			_, err := p.b.Recv(p.ctx, buf)
			require.ErrorIs(t, err, io.EOF)
			require.NoError(t, p.b.Send(p.ctx, []byte("back")), "the other direction goes on")
			n, err := p.a.Recv(p.ctx, buf)
			require.NoError(t, err)
			require.Equal(t, "back", string(buf[:n]))
		})
	}
}

// Closing an XRC listener closes the connections not yet accepted (their
// dialers read the end), leaves the accepted ones open, and is idempotent;
// Accept then returns ErrClosed, and Listeners counts it no more.
func TestDocFabricListenerCloseClosesUnaccepted(t *testing.T) {
	ctx, _, l, _, dopts := closingListener(t)
	kept, err := Dial(ctx, l.Addr().String(), dopts...)
	require.NoError(t, err)
	defer kept.Close()
	acc, err := l.Accept(ctx)
	require.NoError(t, err)
	defer acc.Close()
	un, err := Dial(ctx, l.Addr().String(), dopts...)
	require.NoError(t, err)
	defer un.Close()
	time.Sleep(50 * time.Millisecond) // its handshake completes
	listeners := GlobalStats().Listeners
	require.NoError(t, l.Close())
	require.NoError(t, l.Close(), "idempotent")
	require.Equal(t, listeners-1, GlobalStats().Listeners)
	_, err = l.Accept(ctx)
	require.ErrorIs(t, err, ErrClosed)
	_, err = un.Recv(ctx, make([]byte, 64))
	require.ErrorIs(t, err, io.EOF, "the unaccepted connection was closed")
	require.NoError(t, kept.Send(ctx, []byte("still")))
	n, err := acc.Recv(ctx, make([]byte, 64))
	require.NoError(t, err)
	require.Equal(t, 5, n)
}

// ConnectionsTotal counts every connection established, ConnectionsOpen
// those not yet released (ProcessStats' doc).
func TestDocConnectionsTotalAndOpen(t *testing.T) {
	ctx := ctxT(t)
	before := GlobalStats()
	f := newFabric(t)
	c, s := fabricPair(ctx, t, f.Node("10.1.0.1").Process(), f.Node("10.1.0.2").Process(), nil, nil)
	got := GlobalStats()
	require.Equal(t, uint64(2), got.ConnectionsTotal-before.ConnectionsTotal)
	require.Equal(t, int64(2), got.ConnectionsOpen-before.ConnectionsOpen)
	require.NoError(t, c.Close())
	require.NoError(t, s.Close())
	require.NoError(t, c.Close(), "idempotent, counted once")
	got = GlobalStats()
	require.Equal(t, before.ConnectionsOpen, got.ConnectionsOpen)
	require.Equal(t, uint64(2), got.ConnectionsTotal-before.ConnectionsTotal)
}

// Dial's connection and Listen's listener outlive their ctx; RecvWithImm
// over XRC receives with ok false; Accept and Recv past a deadline give
// *OpError values that match os.ErrDeadlineExceeded and are Timeouts
// (and Temporary, as net.Error's timeouts are).
func TestDocFabricContextsAndErrors(t *testing.T) {
	ctx := ctxT(t)
	f := newFabric(t)
	srv, cli := f.Node("10.1.0.1").Process(), f.Node("10.1.0.2").Process()
	lctx, lcancel := context.WithCancel(ctx)
	l, err := Listen(lctx, "10.1.0.1:0", WithFabric(srv), WithDomainPath(filepath.Join(t.TempDir(), "s")), WithXRC(XRCRequire))
	require.NoError(t, err)
	lcancel()
	defer l.Close()
	dctx, dcancel := context.WithCancel(ctx)
	c, err := Dial(dctx, l.Addr().String(), WithFabric(cli), WithDomainPath(filepath.Join(t.TempDir(), "c")))
	require.NoError(t, err)
	dcancel()
	defer c.Close()
	s, err := l.Accept(ctx)
	require.NoError(t, err)
	defer s.Close()
	require.Equal(t, TransportXRC, s.Transport())
	require.NoError(t, c.Send(ctx, []byte("after ctx")))
	buf := make([]byte, 64)
	n, imm, ok, err := s.RecvWithImm(ctx, buf)
	require.NoError(t, err)
	require.Equal(t, "after ctx", string(buf[:n]))
	require.False(t, ok)
	require.Zero(t, imm)

	check := func(what string, err error) {
		t.Helper()
		require.ErrorIs(t, err, context.DeadlineExceeded, what)
		require.ErrorIs(t, err, os.ErrDeadlineExceeded, what)
		_, isOp := err.(*OpError)
		require.True(t, isOp, "%s: %T", what, err)
		var ne net.Error
		require.True(t, errors.As(err, &ne) && ne.Timeout() && ne.Temporary(), what)
	}
	actx, acancel := context.WithTimeout(ctx, 20*time.Millisecond)
	_, err = l.Accept(actx)
	acancel()
	check("Accept", err)
	rctx, rcancel := context.WithTimeout(ctx, 20*time.Millisecond)
	_, err = c.Recv(rctx, buf)
	rcancel()
	check("Recv", err)
	var ne net.Error
	require.True(t, errors.As(c.Send(ctx, make([]byte, c.MaxMessageSize()+1)), &ne))
	require.False(t, ne.Timeout() || ne.Temporary(), "a message too long is neither")
}

// Raw connections send no keepalive probes (WithKeepalive's doc), and a raw
// peer's disconnect is its end of stream: the peer reads what came first,
// then ErrPeerGone, and it is not counted in Stats.Errors (Stats' doc).
func TestDocRawNoProbesAndPeerCloseNotAnError(t *testing.T) {
	a, b, _ := fakePair(t, fakeOpts{raw: true, keepalive: 5 * time.Millisecond})
	ctx := ctxT(t)
	time.Sleep(50 * time.Millisecond)
	require.Zero(t, a.Stats().Keepalives)
	require.Zero(t, b.Stats().Keepalives)
	require.NoError(t, b.Send(ctx, []byte("last")))
	require.NoError(t, b.Close())
	buf := make([]byte, 64)
	n, err := a.Recv(ctx, buf)
	require.NoError(t, err)
	require.Equal(t, "last", string(buf[:n]))
	_, err = a.NetConn().Read(buf)
	require.ErrorIs(t, err, ErrPeerGone, "no end-of-stream message: not io.EOF")
	require.Zero(t, a.Stats().Errors)
	require.NoError(t, a.Close())
	require.Zero(t, a.Stats().Errors)
}

// Stats count the net.Conn adapter's chunks as messages (Stats' doc):
// a Write of more than MaxMessageSize goes as several.
func TestDocNetConnChunksCounted(t *testing.T) {
	for _, tr := range parityTransports {
		t.Run(tr.name, func(t *testing.T) {
			p := tr.pair(t)
			size := 3*p.a.MaxMessageSize() + 1
			data := bytes.Repeat([]byte("x"), size)
			got := make(chan []byte, 1)
			go func() {
				b, _ := io.ReadAll(io.LimitReader(p.b.NetConn(), int64(size)))
				got <- b
			}()
			n, err := p.a.NetConn().Write(data)
			require.NoError(t, err)
			require.Equal(t, size, n)
			require.Equal(t, data, <-got)
			require.Equal(t, uint64(4), p.a.Stats().MessagesSent)
			require.Equal(t, uint64(size), p.a.Stats().BytesSent)
			require.Equal(t, uint64(4), p.b.Stats().MessagesReceived)
			require.Equal(t, uint64(size), p.b.Stats().BytesReceived)
		})
	}
}

// WithDomainPath's default: goxrc-<euid> in the system's temporary
// directory.
func TestDocDefaultDomainPath(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	ctx := ctxT(t)
	f := newFabric(t)
	l, err := Listen(ctx, "10.1.0.1:0", WithFabric(f.Node("10.1.0.1").Process()))
	require.NoError(t, err)
	defer l.Close()
	st, err := os.Stat(filepath.Join(tmp, fmt.Sprintf("goxrc-%d", os.Geteuid())))
	require.NoError(t, err)
	require.True(t, st.IsDir())
	require.Equal(t, os.FileMode(0o700), st.Mode().Perm())
}

// After a device loss (ErrDeviceRemoved's doc) a connection's calls fail
// with ErrDeviceRemoved wrapping ErrPeerGone as well, Stats.Errors counts
// it, Close returns nil, and the calls after Close report that failure (the
// one that broke the connection before), on RC and over XRC.
func TestDocDeviceLostErrors(t *testing.T) {
	for _, tr := range parityTransports {
		t.Run(tr.name, func(t *testing.T) {
			p := tr.pair(t)
			p.loseA()
			both := func(what string, err error) {
				t.Helper()
				require.ErrorIs(t, err, ErrDeviceRemoved, what)
				require.ErrorIs(t, err, ErrPeerGone, what)
			}
			both("Send", p.a.Send(p.ctx, []byte("x")))
			_, err := p.a.Recv(p.ctx, make([]byte, 64))
			both("Recv", err)
			require.Equal(t, uint64(1), p.a.Stats().Errors)
			require.NoError(t, p.a.Close())
			require.NoError(t, p.a.Close())
			both("Send after Close", p.a.Send(p.ctx, []byte("x")))
			_, err = p.a.Recv(p.ctx, make([]byte, 64))
			both("Recv after Close", err)
			require.Equal(t, uint64(1), p.a.Stats().Errors)
		})
	}
}
