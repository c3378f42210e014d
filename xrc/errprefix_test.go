package xrc

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// An *OpError around one of the package's own errors says "xrc:" once.
// Its sentinels start with "xrc: " (they are returned bare too, by Conn.Err
// and Endpoint.Err), and OpError.Error put its own "xrc: " before them: a
// Send after the peer's FIN read "xrc: send ADDR: xrc: connection closed by
// peer". Driven on memfabric: the peer's FIN, a buffer too short, a peer
// whose process died, a process that died under the endpoint.
func TestOpErrorSaysXRCOnce(t *testing.T) {
	w := newWorld(t)
	a := w.endpoint("10.0.68.1", 7000)
	b := w.endpoint("10.0.68.2", 7000)
	c, d := pair(t, a, b)

	check := func(what string, err error, sentinel error, want string) {
		t.Helper()
		t.Logf("%s: %v", what, err)
		if err == nil {
			t.Fatalf("%s: no error", what)
		}
		if !errors.Is(err, sentinel) {
			t.Errorf("%s: %v does not match %v", what, err, sentinel)
		}
		if n := strings.Count(err.Error(), "xrc: "); n != 1 {
			t.Errorf("%s: %q says \"xrc: \" %d times", what, err, n)
		}
		if want != "" && err.Error() != want {
			t.Errorf("%s: %q, want %q", what, err, want)
		}
	}

	// Recv with a buffer too short for the next message.
	if err := d.Send(ctxT(t, 5*time.Second), []byte("hello world")); err != nil {
		t.Fatal(err)
	}
	_, err := c.Recv(ctxT(t, 5*time.Second), make([]byte, 2))
	check("recv, short buffer", err, ErrMessageTooLong,
		"xrc: recv "+d.LocalAddr().String()+": message too long: 11-byte message, 2-byte buffer")

	// Send after the peer's FIN.
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	var serr error
	eventually(t, "the peer's FIN", func() (bool, string) {
		serr = c.Send(ctxT(t, 5*time.Second), []byte("x"))
		return errors.Is(serr, ErrPeerClosed), ""
	})
	check("send after the peer's FIN", serr, ErrPeerClosed,
		"xrc: send "+d.LocalAddr().String()+": connection closed by peer")
	if err := c.CloseWrite(); err != nil {
		check("close write after the peer's FIN", err, ErrPeerClosed, "")
	}

	// A peer whose process died: the connection fails with ErrPeerGone.
	e := w.endpoint("10.0.68.3", 7000)
	c2, _ := pair(t, a, e)
	e.p.Kill()
	check("send to a dead peer", sendErr(t, c2), ErrPeerGone, "")

	// The process under the endpoint died.
	f := w.endpoint("10.0.68.4", 7000)
	c3, _ := pair(t, f, b)
	f.p.Kill()
	check("send from a dead process", sendErr(t, c3), ErrProcessDied, "")
	_, err = f.Dial(ctxT(t, 5*time.Second), b.Addr().String())
	check("dial from a dead process", err, ErrProcessDied, "")
}
