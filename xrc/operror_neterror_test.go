package xrc

import (
	"context"
	"errors"
	"net"
	"syscall"
	"testing"
	"time"
)

// An *OpError is a net.Error, as package cm's is (the project's errors
// follow package net's): a Dial whose deadline passed is a Timeout to code
// that asks the error itself (err.(net.Error)), as net/http and most
// net.Conn users do, and a refusal or a closed connection is not. OpError
// had neither method: the type assertion failed, and errors.As found a
// net.Error only where the cause happened to be one (the context's
// deadline), never for ErrPeerClosed, ErrInvalid or ErrClosed.
//
// And an OpError without an address says so once, as verbs.OpError does:
// a Config without Addr gave "xrc: listen : not an ip:port".
func TestOpErrorIsANetError(t *testing.T) {
	w := newWorld(t)
	a := w.endpoint("10.0.0.1", 7001)
	b := w.endpoint("10.0.0.2", 7001)
	ctx := ctxT(t, 10*time.Second)

	passed, cancel := context.WithDeadline(ctx, time.Now().Add(-time.Second))
	defer cancel()
	_, err := a.Dial(passed, "10.0.0.2:7001")
	ne, ok := err.(net.Error)
	if !ok || !ne.Timeout() || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Dial past its deadline: %T %v, want a net.Error that is a Timeout", err, err)
	}

	_, err = a.Dial(ctx, "10.0.0.2:7999")
	if ne, ok := err.(net.Error); !ok || ne.Timeout() || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("Dial to no listener: %T %v, want a net.Error, refused, not a Timeout", err, err)
	}

	var unanswered error = &OpError{"dial", "10.0.0.2:7001", &RejectError{Status: -int(syscall.ETIMEDOUT)}}
	if ne, ok := unanswered.(net.Error); !ok || !ne.Timeout() || !ne.Temporary() {
		t.Errorf("%v: not a net.Error that is a Timeout", unanswered)
	}

	ca, cb := pair(t, a, b)
	cb.Close()
	var ce error
	for ce == nil {
		ce = ca.Send(ctx, []byte("x"))
		time.Sleep(time.Millisecond)
	}
	if ne, ok := ce.(net.Error); !ok || ne.Timeout() || ne.Temporary() || !errors.Is(ce, ErrPeerClosed) {
		t.Errorf("Send after the peer's Close: %T %v, want a net.Error, ErrPeerClosed, neither Timeout nor Temporary", ce, ce)
	}
	ca.Close()

	_, err = NewEndpoint(ctx, Config{Process: w.f.Node("10.0.0.5").Process()})
	if want := "xrc: listen: not an ip:port (invalid argument)"; err == nil || err.Error() != want {
		t.Errorf("NewEndpoint without Addr: %v, want %q", err, want)
	}
	if _, ok := err.(net.Error); !ok || !errors.Is(err, ErrInvalid) {
		t.Errorf("NewEndpoint without Addr: %T %v, want a net.Error matching ErrInvalid", err, err)
	}
}
