package cm

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/internal/conntest"
	"github.com/goxrc/goxrc/xrc"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// Three server processes on one node share its XRC domain, each listening on
// its own port; one client process reaches all three over one uplink.
func TestFabricXRCSharesOneUplink(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f := newFabric(t)
	serverNode, clientNode := f.Node("10.1.0.1"), f.Node("10.1.0.2")
	domain := filepath.Join(t.TempDir(), "xrc")
	const servers = 3
	var addrs []string
	for i := 0; i < servers; i++ {
		l, err := Listen(ctx, "10.1.0.1:0", WithFabric(serverNode.Process()), WithDomainPath(domain))
		require.NoError(t, err)
		defer l.Close()
		addrs = append(addrs, l.Addr().String())
		go func() {
			c, err := l.Accept(ctx)
			if err != nil {
				return
			}
			buf := make([]byte, 64)
			for {
				n, err := c.Recv(ctx, buf)
				if err != nil {
					c.Close()
					return
				}
				if c.Send(ctx, append([]byte("from "+l.Addr().String()+": "), buf[:n]...)) != nil {
					return
				}
			}
		}()
	}
	client, clientDomain := clientNode.Process(), filepath.Join(t.TempDir(), "xrc")
	var conns []*Conn
	for _, a := range addrs {
		c, err := Dial(ctx, a, WithFabric(client), WithDomainPath(clientDomain))
		require.NoError(t, err)
		conns = append(conns, c)
	}
	buf := make([]byte, 128)
	for i, c := range conns {
		msg := fmt.Sprintf("hello %d", i)
		require.NoError(t, c.Send(ctx, []byte(msg)))
		n, err := c.Recv(ctx, buf)
		require.NoError(t, err)
		require.Equal(t, "from "+addrs[i]+": "+msg, string(buf[:n]))
	}
	// The client node: one INI to the server node, and one TGT per server
	// process that sends back. The server node: one INI per process, and
	// one TGT for the client's INI, shared by all three.
	cs, ss := clientNode.Stats(), serverNode.Stats()
	require.Equal(t, 1, cs.INIs)
	require.Equal(t, servers, cs.TGTs)
	require.Equal(t, servers, ss.INIs)
	require.Equal(t, 1, ss.TGTs)
	require.Equal(t, servers, ss.TGTHandles, "each server process holds one handle on the shared TGT")
	require.Equal(t, 1, GlobalStats().XRCUplinks-servers, "the client process has one uplink")

	_, err := conns[0].RegisterMemory(4096, 0)
	require.ErrorIs(t, err, ErrNotSupported)
	require.ErrorIs(t, conns[0].SendWithImm(ctx, []byte("x"), 1), ErrNotSupported)

	for _, c := range conns {
		require.NoError(t, c.Close())
		require.NoError(t, c.Close(), "idempotent")
	}
	require.Eventually(t, func() bool { return clientNode.Stats().INIs == 0 }, 10*time.Second, 20*time.Millisecond,
		"the client's uplink goes with its last connection")
}

// Half-close over XRC, through the stream adapter.
func TestFabricXRCCloseWrite(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f := newFabric(t)
	l, err := Listen(ctx, "10.1.0.1:0", WithFabric(f.Node("10.1.0.1").Process()), WithDomainPath(filepath.Join(t.TempDir(), "a")),
		WithMessageSize(256), WithQueueDepth(4))
	require.NoError(t, err)
	defer l.Close()
	c, s := dialAccepted(ctx, t, l, WithFabric(f.Node("10.1.0.2").Process()), WithDomainPath(filepath.Join(t.TempDir(), "b")),
		WithMessageSize(256), WithQueueDepth(4))
	conntest.HalfClose(t, c.NetConn(), s.NetConn(), 300)
}

func TestFabricRejectsWhatXRCCannotDo(t *testing.T) {
	ctx := context.Background()
	p := newFabric(t).Node("10.1.0.1").Process()
	_, err := Listen(ctx, "10.1.0.1:0", WithFabric(p), WithXRC(XRCOff), WithDomainPath(filepath.Join(t.TempDir(), "xrc")))
	require.ErrorContains(t, err, "XRC connections only")
	require.ErrorIs(t, err, ErrInvalid)
	_, err = Listen(ctx, "10.1.0.1:0", WithFabric(p), WithRawMessages(), WithDomainPath(filepath.Join(t.TempDir(), "xrc")))
	require.ErrorIs(t, err, ErrNotSupported)
	_, err = Dial(ctx, "10.1.0.9:1", WithFabric(p), WithDomainPath(filepath.Join(t.TempDir(), "xrc")), WithHandshakeTimeout(time.Second))
	require.Error(t, err, "nobody listens there")
}

// CloseWrite after the peer's Close reports the peer's end (ErrPeerGone),
// as Send does then and as an RC connection's CloseWrite does, not
// ErrClosed, which says the application closed the Conn: the engine closes
// our side by itself at the peer's FIN, and CloseWrite took that close for
// the application's. A proxy that half-closes after copying saw "use of
// closed network connection" for a connection it never closed.
func TestFabricCloseWriteAfterPeerClose(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	f := newFabric(t)
	c, s := fabricPair(ctx, t, f.Node("10.1.0.1").Process(), f.Node("10.1.0.2").Process(), nil, nil)
	require.NoError(t, s.Close())
	_, err := c.Recv(ctx, make([]byte, c.MaxRecvSize()))
	require.ErrorIs(t, err, io.EOF)
	err = c.CloseWrite()
	require.ErrorIs(t, err, ErrPeerGone)
	require.NotErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, c.Send(ctx, []byte("x")), ErrPeerGone)
	require.NoError(t, c.Close())
	require.ErrorIs(t, c.CloseWrite(), ErrClosed, "after our own Close")
}

// A killed server process: the client's calls fail with ErrPeerGone, and
// the client node's kernel objects go with its connection.
func TestFabricPeerKilled(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f := newFabric(t)
	srv, clientNode := f.Node("10.1.0.1").Process(), f.Node("10.1.0.2")
	c, _ := fabricPair(ctx, t, srv, clientNode.Process(), nil, nil)
	srv.Kill()
	_, err := c.Recv(ctx, make([]byte, 16))
	require.ErrorIs(t, err, ErrPeerGone)
	require.NoError(t, c.Close())
	require.Eventually(t, func() bool { return clientNode.Stats().QPs() == 0 }, 10*time.Second, 20*time.Millisecond)
}

// The dialer endpoints are shared per site and options, and counted: every acquire of a
// site gets the same endpoint, each release drops one reference (a second
// call of the same release does nothing), and the last one closes it.
func TestXRCDialerRefcount(t *testing.T) {
	ctx := context.Background()
	f := newFabric(t)
	cfg, err := newConfig([]Option{WithDomainPath(filepath.Join(t.TempDir(), "xrc"))})
	require.NoError(t, err)
	cfg.fabric = f.Node("10.1.0.1").Process()
	site := cfg.fabricSite(cfg.fabric.Node().Addr())
	ep1, rel1, err := acquireDialer(ctx, cfg, site)
	require.NoError(t, err)
	ep2, rel2, err := acquireDialer(ctx, cfg, site)
	require.NoError(t, err)
	require.Same(t, ep1, ep2, "one endpoint per site and options")

	other := cfg
	other.fabric = f.Node("10.1.0.2").Process()
	ep3, rel3, err := acquireDialer(ctx, other, other.fabricSite(other.fabric.Node().Addr()))
	require.NoError(t, err)
	require.NotSame(t, ep1, ep3, "another process is another site")
	rel3()

	refs := func() int {
		xrcDialers.Lock()
		defer xrcDialers.Unlock()
		if d := xrcDialers.m[dialerKey(t, cfg, site)]; d != nil {
			return d.refs
		}
		return 0
	}
	require.Equal(t, 2, refs())
	rel1()
	rel1()
	require.Equal(t, 1, refs(), "a release counts once")
	_, err = ep1.Accept(canceledCtx())
	require.ErrorIs(t, err, context.Canceled, "still open")
	rel2()
	require.Equal(t, 0, refs())
	_, err = ep1.Accept(ctx)
	require.ErrorIs(t, err, net.ErrClosed, "the last release closes it")
	require.Zero(t, GlobalStats().XRCQueuePairs)

	// Options XRC cannot honour fail before any endpoint exists.
	raw := cfg
	raw.raw = true
	_, _, err = acquireDialer(ctx, raw, cfg.fabricSite(netip.MustParseAddr("10.1.0.3")))
	require.ErrorIs(t, err, ErrNotSupported)
}

// dialerKey is the key of cfg's dialer endpoint on site in xrcDialers.
func dialerKey(t *testing.T, cfg config, site xrcSite) xrc.Config {
	t.Helper()
	xc, err := cfg.xrcConfig(site, 0)
	require.NoError(t, err)
	xc.DialOnly = true
	return xc
}

func canceledCtx() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// A listener on an unspecified address serves every device; XRC serves one.
func TestXRCUnboundListener(t *testing.T) {
	var log strings.Builder
	cfg, err := newConfig([]Option{WithXRC(XRCPrefer), WithLogger(slog.New(slog.NewTextHandler(&log, nil)))})
	require.NoError(t, err)
	require.NoError(t, cfg.checkXRCUnbound())
	require.Contains(t, log.String(), "XRC unavailable, using RC")
	cfg.xrc = XRCRequire
	err = cfg.checkXRCUnbound()
	require.ErrorIs(t, err, ErrNotSupported)
	require.ErrorContains(t, err, "WithDevice")
	cfg.xrc = XRCOff
	require.NoError(t, cfg.checkXRCUnbound())
}

// XRC connections have flow control too: WithQueueDepth is how many
// messages a receiver holds before its sender waits, and what a slow
// receiver takes later arrives whole and in order.
func TestFabricXRCFlowControl(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f := newFabric(t)
	const depth = 2
	opts := []Option{WithQueueDepth(depth)}
	c, s := fabricPair(ctx, t, f.Node("10.1.0.1").Process(), f.Node("10.1.0.2").Process(), opts, opts)

	for i := range depth {
		require.NoError(t, c.Send(ctx, []byte{byte(i)}))
	}
	short, cancelShort := context.WithTimeout(ctx, 50*time.Millisecond)
	err := c.Send(short, []byte("one too many"))
	cancelShort()
	require.ErrorIs(t, err, context.DeadlineExceeded, "the receiver's window is full: the sender waits")
	require.ErrorIs(t, err, os.ErrDeadlineExceeded, "as OpError's doc says")

	const n = 200
	errc := make(chan error, 1)
	go func() {
		for i := depth; i < n; i++ {
			if err := c.Send(ctx, []byte{byte(i)}); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	buf := make([]byte, 16)
	for i := range n {
		k, err := s.Recv(ctx, buf)
		require.NoError(t, err)
		require.Equal(t, []byte{byte(i)}, buf[:k], "message %d", i)
	}
	require.NoError(t, <-errc)
}

// Over XRC, WithMessageSize sizes what an endpoint receives (its SRQ's
// slots), and each side learns the other's when the connection is set up:
// MaxMessageSize is the smaller of the two, and a larger Send fails with
// ErrMessageTooLong and sends nothing.
func TestFabricXRCMessageSizes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f := newFabric(t)
	c, s := fabricPair(ctx, t, f.Node("10.1.0.1").Process(), f.Node("10.1.0.2").Process(),
		[]Option{WithMessageSize(1000)}, []Option{WithMessageSize(4000)})

	require.Equal(t, 1000, c.MaxMessageSize(), "the dialer sends what the listener takes")
	require.Equal(t, 1000, s.MaxMessageSize(), "the listener's own limit is the smaller")
	require.ErrorIs(t, c.Send(ctx, make([]byte, 1001)), ErrMessageTooLong)
	require.NoError(t, c.Send(ctx, make([]byte, 1000)))
	buf := make([]byte, 4000)
	n, err := s.Recv(ctx, buf)
	require.NoError(t, err)
	require.Equal(t, 1000, n, "the message over the limit was not sent")
}

// fabricPair listens on srv (an in-memory fabric's process) and dials it
// from cli, each side with its options and a domain of its own, and
// returns the dialed and the accepted end, closed when the test ends.
func fabricPair(ctx context.Context, t *testing.T, srv, cli *memfabric.Process, lopts, dopts []Option) (c, s *Conn) {
	t.Helper()
	l, err := Listen(ctx, srv.Node().Addr().String()+":0",
		append([]Option{WithFabric(srv), WithDomainPath(filepath.Join(t.TempDir(), "xrc"))}, lopts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	return dialAccepted(ctx, t, l, append([]Option{WithFabric(cli), WithDomainPath(filepath.Join(t.TempDir(), "xrc"))}, dopts...)...)
}

// dialAccepted dials l with opts and returns the dialed end and the one l
// accepted, closed when the test ends.
func dialAccepted(ctx context.Context, t *testing.T, l *Listener, opts ...Option) (c, s *Conn) {
	t.Helper()
	accepted := make(chan *Conn, 1)
	go func() {
		a, err := l.Accept(ctx)
		if err != nil {
			t.Errorf("accept: %v", err)
		}
		accepted <- a
	}()
	c, err := Dial(ctx, l.Addr().String(), opts...)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	s = <-accepted
	require.NotNil(t, s)
	t.Cleanup(func() { s.Close() })
	return c, s
}

// A process's XRC Dials share a dialer endpoint only where their options
// agree: the endpoint's receive slots are the Dial's message size, so a
// Dial with another size gets an endpoint of its own and receives what it
// asked for. It used to join the first Dial's endpoint and receive by that
// one's size, larger or smaller than its own.
func TestFabricDialsOfOtherSizesGetTheirOwnEndpoint(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f := newFabric(t)
	srv, cli := f.Node("10.1.0.1").Process(), f.Node("10.1.0.2").Process()
	l, err := Listen(ctx, "10.1.0.1:0", WithFabric(srv), WithDomainPath(filepath.Join(t.TempDir(), "xrc")))
	require.NoError(t, err)
	defer l.Close()
	dom := filepath.Join(t.TempDir(), "xrc")
	dial := func(opts ...Option) (*Conn, *Conn) {
		t.Helper()
		c, err := Dial(ctx, l.Addr().String(), append([]Option{WithFabric(cli), WithDomainPath(dom)}, opts...)...)
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		s, err := l.Accept(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { s.Close() })
		return c, s
	}
	big, bigSrv := dial(WithMessageSize(8192))
	small, smallSrv := dial(WithMessageSize(1024))
	big2, _ := dial(WithMessageSize(8192))

	require.Equal(t, big.LocalAddr(), big2.LocalAddr(), "Dials with the same options share an endpoint")
	require.NotEqual(t, big.LocalAddr(), small.LocalAddr(), "a Dial of another size has its own endpoint")
	require.Equal(t, 8192, big.MaxRecvSize())
	require.Equal(t, 1024, small.MaxRecvSize())
	require.Equal(t, 1024, smallSrv.MaxMessageSize(), "the peer sends what the small Dial receives")

	require.ErrorIs(t, smallSrv.Send(ctx, make([]byte, 2048)), ErrMessageTooLong)
	msg := bytes.Repeat([]byte("0123456789abcdef"), 64)
	require.NoError(t, smallSrv.Send(ctx, msg))
	buf := make([]byte, small.MaxRecvSize())
	n, err := small.Recv(ctx, buf)
	require.NoError(t, err)
	require.Equal(t, msg, buf[:n])

	// The large Dial's adapter reads a message of its full size.
	msg = bytes.Repeat([]byte("0123456789abcdef"), 512)
	require.NoError(t, bigSrv.Send(ctx, msg))
	nc := big.NetConn()
	require.NoError(t, nc.SetReadDeadline(time.Now().Add(5*time.Second)))
	got := make([]byte, len(msg))
	_, err = io.ReadFull(nc, got)
	require.NoError(t, err)
	require.Equal(t, msg, got)
}

// A Recv buffer shorter than an XRC message gives ErrMessageTooLong and
// leaves the message queued, as on RC (the engine used to truncate it).
func TestFabricShortBufferKeepsMessage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	f := newFabric(t)
	c, s := fabricPair(ctx, t, f.Node("10.1.0.1").Process(), f.Node("10.1.0.2").Process(), []Option{WithMessageSize(16)}, nil)
	require.NoError(t, c.Send(ctx, make([]byte, 40))) // the engine's floor is 64 bytes
	_, err := s.Recv(ctx, make([]byte, 16))
	require.ErrorIs(t, err, ErrMessageTooLong)
	n, err := s.Recv(ctx, make([]byte, 64))
	require.NoError(t, err, "the message stays queued")
	require.Equal(t, 40, n)
}

// Over XRC as over RC (TestConnReadAfterOwnDataReachesShortPeer), a message
// read goes back to a sender at the window, though one read is below the
// credit threshold (half the depth): the sender's next Send waited for
// ever.
func TestFabricXRCReadBelowThresholdReachesSender(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f := newFabric(t)
	const depth = 8
	opts := []Option{WithQueueDepth(depth)}
	c, s := fabricPair(ctx, t, f.Node("10.1.0.1").Process(), f.Node("10.1.0.2").Process(), opts, opts)
	for i := range depth {
		require.NoError(t, c.Send(ctx, []byte{byte(i)}))
	}
	sent := make(chan error, 1)
	go func() { sent <- c.Send(ctx, []byte{depth}) }() // waits for a credit
	buf := make([]byte, 16)
	k, err := s.Recv(ctx, buf)
	require.NoError(t, err)
	require.Equal(t, []byte{0}, buf[:k])
	require.NoError(t, <-sent, "the sender never got the credit of the read") // ctx: a hang guard, not a bound
}

// endpointOf returns the XRC endpoint cm opened for p.
func endpointOf(t *testing.T, p *memfabric.Process) *xrc.Endpoint {
	t.Helper()
	var ep *xrc.Endpoint
	xrcEndpoints.Range(func(k, v any) bool {
		if v.(*memfabric.Process) == p {
			ep = k.(*xrc.Endpoint)
		}
		return true
	})
	require.NotNil(t, ep, "no endpoint of the process")
	return ep
}

// awaitConns waits until ep holds n connections: the engine is done with
// the others (it forgets a connection once both its legs are gone).
func awaitConns(t *testing.T, ep *xrc.Endpoint, n int, within time.Duration) {
	t.Helper()
	require.Eventually(t, func() bool { return ep.Stats().Conns == n }, within, time.Millisecond)
}
