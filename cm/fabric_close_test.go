package cm

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/xrc/memfabric"
)

// closingListener is a listener on node 10.1.0.1 of a new fabric, which
// the test closes itself, and the options of a Dial from node 10.1.0.2.
func closingListener(t *testing.T) (ctx context.Context, f *memfabric.Fabric, l *Listener, srv *memfabric.Process, dopts []Option) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	f = newFabric(t)
	srv = f.Node("10.1.0.1").Process()
	l, err := Listen(ctx, "10.1.0.1:0", WithFabric(srv), WithDomainPath(filepath.Join(t.TempDir(), "s")))
	require.NoError(t, err)
	return ctx, f, l, srv, []Option{WithFabric(f.Node("10.1.0.2").Process()), WithDomainPath(filepath.Join(t.TempDir(), "c"))}
}

// Closing an XRC listener leaves its accepted connections open, as on RC:
// they go on both ways, a new Dial is refused (ECONNREFUSED), and the
// listener's endpoint closes with the last of them. The endpoint and its
// connections used to close together with the listener.
func TestFabricListenerCloseKeepsAcceptedConns(t *testing.T) {
	ctx, f, l, srv, dopts := closingListener(t)
	var cs, ss []*Conn
	for range 2 {
		c, err := Dial(ctx, l.Addr().String(), dopts...)
		require.NoError(t, err)
		defer c.Close()
		s, err := l.Accept(ctx)
		require.NoError(t, err)
		defer s.Close()
		cs, ss = append(cs, c), append(ss, s)
	}
	listeners := GlobalStats().Listeners
	require.NoError(t, l.Close())
	require.NoError(t, l.Close(), "idempotent")
	require.Equal(t, listeners-1, GlobalStats().Listeners)
	_, err := l.Accept(ctx)
	require.ErrorIs(t, err, ErrClosed)
	_, err = Dial(ctx, l.Addr().String(), dopts...)
	require.ErrorIs(t, err, syscall.ECONNREFUSED, "a closed listener refuses new connections")
	lopts := []Option{WithFabric(srv), WithDomainPath(filepath.Join(t.TempDir(), "s2"))}
	_, err = Listen(ctx, l.Addr().String(), lopts...)
	require.ErrorIs(t, err, syscall.EADDRINUSE, "the port is held while accepted connections are open")

	buf := make([]byte, 64)
	for i := range cs {
		for _, p := range [][2]*Conn{{cs[i], ss[i]}, {ss[i], cs[i]}} {
			msg := fmt.Sprintf("after the listener's close, %d", i)
			require.NoError(t, p[0].Send(ctx, []byte(msg)))
			n, err := p[1].Recv(ctx, buf)
			require.NoError(t, err)
			require.Equal(t, msg, string(buf[:n]))
		}
	}
	require.NoError(t, ss[0].Close())
	_, err = cs[0].Recv(ctx, buf)
	require.ErrorIs(t, err, io.EOF)
	require.NoError(t, ss[1].Send(ctx, []byte("the last one")), "one connection still holds the endpoint")
	_, err = cs[1].Recv(ctx, buf)
	require.NoError(t, err)
	node := f.Node("10.1.0.1")
	require.NotZero(t, node.Stats().QPs(), "the listener's endpoint is still open")
	require.NoError(t, ss[1].Close())
	require.Eventually(t, func() bool { return node.Stats().QPs() == 0 && node.Stats().TGTHandles == 0 },
		5*time.Second, 10*time.Millisecond, "the endpoint closes with its last connection: %+v", node.Stats())
	l2, err := Listen(ctx, l.Addr().String(), lopts...)
	require.NoError(t, err, "the port is free again")
	require.NoError(t, l2.Close())
}

// http.Server.Shutdown over XRC is graceful: it closes the listener, then
// waits for the request in flight, which completes. Closing the listener
// used to close the connection under the request.
func TestFabricHTTPShutdownWaitsForRequest(t *testing.T) {
	ctx, _, l, _, dopts := closingListener(t)
	inHandler, release := make(chan struct{}), make(chan struct{})
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(inHandler)
		<-release
		io.WriteString(w, "done after shutdown began")
	})}
	go hs.Serve(l.NetListener())
	d := &Dialer{Options: dopts}
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
		return d.DialContext(ctx, "rdma", addr)
	}}}
	type result struct {
		body string
		err  error
	}
	got := make(chan result, 1)
	go func() {
		resp, err := hc.Get("http://" + l.Addr().String() + "/")
		if err != nil {
			got <- result{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		got <- result{string(b), err}
	}()
	<-inHandler
	shut := make(chan error, 1)
	go func() { shut <- hs.Shutdown(ctx) }()
	time.Sleep(50 * time.Millisecond) // Shutdown has closed the listener
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned with a request in flight: %v", err)
	default:
	}
	close(release)
	r := <-got
	require.NoError(t, r.err)
	require.Equal(t, "done after shutdown began", r.body)
	require.NoError(t, <-shut)
	hc.CloseIdleConnections()
	_, err := d.DialContext(ctx, "rdma", l.Addr().String())
	require.ErrorIs(t, err, syscall.ECONNREFUSED, "the server's listener is closed")
}

// listenerWithConn opens an XRC listener on an in-memory fabric (options
// lopts) and one connection to it from another node (options dopts).
func listenerWithConn(t *testing.T) (ctx context.Context, f *memfabric.Fabric, l *Listener, lopts, dopts []Option, c0, s0 *Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	f = newFabric(t)
	lopts = []Option{WithFabric(f.Node("10.1.0.1").Process()), WithDomainPath(filepath.Join(t.TempDir(), "s")), WithMessageSize(256)}
	dopts = []Option{WithFabric(f.Node("10.1.0.2").Process()), WithDomainPath(filepath.Join(t.TempDir(), "c")), WithMessageSize(256)}
	l, err := Listen(ctx, "10.1.0.1:0", lopts...)
	require.NoError(t, err)
	c0, err = Dial(ctx, l.Addr().String(), dopts...)
	require.NoError(t, err)
	s0, err = l.Accept(ctx)
	require.NoError(t, err)
	return ctx, f, l, lopts, dopts, c0, s0
}

// A Listen on the address of a closed XRC listener whose connections still
// hold its port, with the same options, takes the listener's endpoint over:
// it accepts new connections there, the old ones go on, and the endpoint
// closes with the last user of either listener. (With other options it
// fails with EADDRINUSE: TestFabricListenerCloseKeepsAcceptedConns.) Such a
// Listen used to fail with EADDRINUSE until the old connections closed, so
// a server could not listen again after http.Server.Shutdown while any
// connection lingered.
func TestFabricRelistenTakesOverClosedListener(t *testing.T) {
	ctx, f, l, lopts, dopts, c0, s0 := listenerWithConn(t)
	defer c0.Close()
	defer s0.Close()
	node := f.Node("10.1.0.1")
	qps := node.Stats().QPs()
	require.NoError(t, l.Close())

	l2, err := Listen(ctx, l.Addr().String(), lopts...)
	require.NoError(t, err, "the same options take the closed listener's endpoint over")
	require.Equal(t, l.Addr(), l2.Addr())
	_, err = l.Accept(ctx)
	require.ErrorIs(t, err, ErrClosed, "the closed listener accepts nothing for the new one")
	c1, err := Dial(ctx, l2.Addr().String(), dopts...)
	require.NoError(t, err)
	defer c1.Close()
	s1, err := l2.Accept(ctx)
	require.NoError(t, err)
	defer s1.Close()
	require.Equal(t, qps, node.Stats().QPs(), "one endpoint: the new connection rides the uplinks of the first")
	_, err = Listen(ctx, l.Addr().String(), lopts...)
	require.ErrorIs(t, err, syscall.EADDRINUSE, "an open listener is not taken over")

	buf := make([]byte, 256)
	exchange := func(what string, pairs ...[2]*Conn) {
		t.Helper()
		for _, p := range pairs {
			for _, q := range [][2]*Conn{p, {p[1], p[0]}} {
				require.NoError(t, q[0].Send(ctx, []byte(what)))
				n, err := q[1].Recv(ctx, buf)
				require.NoError(t, err)
				require.Equal(t, what, string(buf[:n]))
			}
		}
	}
	exchange("both listeners' connections", [2]*Conn{c0, s0}, [2]*Conn{c1, s1})
	require.NoError(t, l2.Close())
	exchange("after the second close", [2]*Conn{c0, s0}, [2]*Conn{c1, s1})
	require.NoError(t, s0.Close())
	require.NotZero(t, node.Stats().QPs(), "the second listener's connection still holds the endpoint")
	exchange("the last one", [2]*Conn{c1, s1})
	require.NoError(t, s1.Close())
	require.Eventually(t, func() bool { return node.Stats().QPs() == 0 && node.Stats().TGTHandles == 0 },
		5*time.Second, 10*time.Millisecond, "the endpoint closes with its last connection: %+v", node.Stats())
	l3, err := Listen(ctx, l.Addr().String(), lopts...)
	require.NoError(t, err, "a new endpoint binds the free port")
	require.NoError(t, l3.Close())
}
