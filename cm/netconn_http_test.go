package cm

import (
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"
)

// chanListener is a net.Listener handing out the server sides of fake pairs.
type chanListener struct {
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}
func (l *chanListener) Close() error   { l.once.Do(func() { close(l.done) }); return nil }
func (l *chanListener) Addr() net.Addr { return fakeAddr("side1") }

// http.Server.Close (and Shutdown's idle sweep) close the server's
// connections one after another under the server's lock; each NetConn Close
// waited out the CM's time-wait, so closing N keep-alive connections took N
// time-waits (2 s apiece on soft-RoCE). A TCPConn's Close does not block,
// and the adapter's leaves the time-wait to the background now: here the
// time-waits last until the test ends them, after srv.Close, whose handshake
// timeout (a minute) is all that would end them otherwise.
func TestNetConnHTTPServerCloseWaitsNoTimewaitEach(t *testing.T) {
	const n = 5
	gate := make(chan struct{})
	l := &chanListener{ch: make(chan net.Conn, n), done: make(chan struct{})}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })}
	go srv.Serve(l)
	tr := &http.Transport{MaxIdleConnsPerHost: n, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		a, b, w := fakePair(t, fakeOpts{msgSize: [2]int{4096, 4096}, timeout: time.Minute})
		b.t = gatedTimewaitEnd{w.ends[1], gate}
		l.ch <- b.NetConn()
		return a.NetConn(), nil
	}}
	hc := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range n {
		wg.Go(func() {
			<-start
			resp, err := hc.Get("http://x/")
			if err != nil {
				t.Error(err)
				return
			}
			io.ReadAll(resp.Body)
			resp.Body.Close()
		})
	}
	close(start)
	wg.Wait()
	time.Sleep(100 * time.Millisecond) // the server's conns go idle
	closed := make(chan struct{})
	go func() { srv.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Errorf("http.Server.Close of %d idle connections waited for their time-waits", n)
	}
	close(gate)
	<-closed
	tr.CloseIdleConnections()
}

// A client whose request times out gets its error at the client's 200 ms
// timeout, not a time-wait (1 s here) later, though http.Transport closes
// the connection on the request's goroutine: the NetConn's Close leaves the
// time-wait to the background. The bound (200 ms plus half the configured
// time-wait) is structural. It guards against a Close that waited out the
// time-wait, which gave the caller its timeout one time-wait late.
func TestNetConnHTTPClientTimeoutWaitsNoTimewait(t *testing.T) {
	const timewait = time.Second
	l := &chanListener{ch: make(chan net.Conn, 1), done: make(chan struct{})}
	release := make(chan struct{})
	defer close(release)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("partial"))
		w.(http.Flusher).Flush()
		<-release
	})}
	go srv.Serve(l)
	defer srv.Close()
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		a, b, w := fakePair(t, fakeOpts{msgSize: [2]int{4096, 4096}})
		a.t = timewaitEnd{w.ends[0], timewait}
		l.ch <- b.NetConn()
		return a.NetConn(), nil
	}}
	hc := &http.Client{Transport: tr, Timeout: 200 * time.Millisecond}
	t0 := time.Now()
	resp, err := hc.Get("http://x/")
	if err == nil {
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	took := time.Since(t0)
	if err == nil {
		t.Fatal("no timeout")
	}
	if took > 200*time.Millisecond+timewait/2 {
		t.Errorf("request with a 200ms timeout returned after %v (%v)", took, err)
	}
}
