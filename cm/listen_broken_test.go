package cm

import (
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"
)

// A listener whose event channel broke closes itself (loop, then Close);
// its Accepts must then say so in a way net.Listener users stop on. With a
// cause whose errno reads as temporary (librdmacm's rdma_get_cm_event fails
// with ENOMEM when it cannot allocate the event), Accept's error had
// Temporary() true and did not match net.ErrClosed, so http.Server.Serve
// retried the dead listener for ever (once a second), never returning.
func TestBrokenListenerAcceptEndsServe(t *testing.T) {
	l := &Listener{ready: make(chan *Conn, 1), done: make(chan struct{}), inProgress: make(chan struct{}, 1)}
	var cause error = &OpError{Op: "rdma_get_cm_event", Err: syscall.ENOMEM}
	l.failed.Store(&cause)
	l.closeOnce.Do(func() { close(l.done) }) // what the loop's go l.Close() does first

	_, err := l.NetListener().Accept()
	requireAcceptEndsServe(t, l, err, "a listener that closed itself")
}

// requireAcceptEndsServe requires err, an Accept's on l, to end a server
// loop: permanent (not Temporary, which http.Server.Serve retries) and
// matching net.ErrClosed; and http.Server.Serve on l to return.
func requireAcceptEndsServe(t *testing.T, l *Listener, err error, what string) {
	t.Helper()
	var ne interface{ Temporary() bool } // what http.Server.Serve asks of an Accept error
	if !errors.As(err, &ne) || ne.Temporary() {
		t.Errorf("Accept on %s: %v, temporary; want a permanent error", what, err)
	}
	if !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept on %s: %v; want it to match net.ErrClosed", what, err)
	}
	srv := &http.Server{ErrorLog: log.New(io.Discard, "", 0)}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l.NetListener()) }()
	select {
	case <-served:
	case <-time.After(3 * time.Second):
		srv.Close() // the loop keeps retrying; this ends it
		<-served
		t.Fatalf("http.Server.Serve kept retrying Accept on %s", what)
	}
}
