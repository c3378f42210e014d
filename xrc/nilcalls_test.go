package xrc_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/goxrc/goxrc/xrc"
)

// TestNilAndZeroCalls: a nil or zero Conn or Endpoint (a Dial, Accept or
// NewEndpoint whose error went unchecked, a new(xrc.Conn)) is a closed
// one, as cm's nil and zero Conn and Listener are: no call panics or
// blocks, Close returns nil, the calls that fail return ErrClosed itself (no
// *OpError: there is no address to name), and the accessors give their zero
// values (Endpoint.Err, which reports ErrClosed after Close, gives
// ErrClosed; Conn.Err, nil after Close, gives nil).
func TestNilAndZeroCalls(t *testing.T) {
	buf := make([]byte, 16)
	closedErr := func(err error) error {
		if err != xrc.ErrClosed {
			return fmt.Errorf("err %v (%T), want ErrClosed itself", err, err)
		}
		return nil
	}
	is := func(got, want any) error {
		if got != want {
			return fmt.Errorf("got %v, want %v", got, want)
		}
		return nil
	}
	type call struct {
		name string
		f    func(ctx context.Context) error
	}
	connCalls := func(kind string, mk func() *xrc.Conn) []call {
		return []call{
			{kind + " Conn.Close", func(context.Context) error { return is(mk().Close(), nil) }},
			{kind + " Conn.CloseWrite", func(context.Context) error { return closedErr(mk().CloseWrite()) }},
			{kind + " Conn.CreditFrames", func(context.Context) error { return is(mk().CreditFrames(), uint64(0)) }},
			{kind + " Conn.Err", func(context.Context) error { return is(mk().Err(), nil) }},
			{kind + " Conn.LocalAddr", func(context.Context) error { return is(mk().LocalAddr(), netip.AddrPort{}) }},
			{kind + " Conn.MaxMessageSize", func(context.Context) error { return is(mk().MaxMessageSize(), 0) }},
			{kind + " Conn.MaxRecvSize", func(context.Context) error { return is(mk().MaxRecvSize(), 0) }},
			{kind + " Conn.Recv", func(ctx context.Context) error {
				n, err := mk().Recv(ctx, buf)
				if n != 0 {
					return fmt.Errorf("n %d", n)
				}
				return closedErr(err)
			}},
			{kind + " Conn.RemoteAddr", func(context.Context) error { return is(mk().RemoteAddr(), netip.AddrPort{}) }},
			{kind + " Conn.Send", func(ctx context.Context) error { return closedErr(mk().Send(ctx, buf)) }},
			{kind + " Conn.Send empty", func(ctx context.Context) error { return closedErr(mk().Send(ctx, nil)) }},
			{kind + " Conn.Send too long", func(ctx context.Context) error {
				return closedErr(mk().Send(ctx, make([]byte, xrc.MaxMessageSize+1)))
			}},
		}
	}
	endpointCalls := func(kind string, mk func() *xrc.Endpoint) []call {
		noConn := func(c *xrc.Conn, err error) error {
			if c != nil {
				return fmt.Errorf("got a Conn %p", c)
			}
			return closedErr(err)
		}
		return []call{
			{kind + " Endpoint.Accept", func(ctx context.Context) error { return noConn(mk().Accept(ctx)) }},
			{kind + " Endpoint.AcceptIn", func(ctx context.Context) error { return noConn(mk().AcceptIn(ctx, xrc.AcceptTerm{})) }},
			{kind + " Endpoint.AcceptIn its Term", func(ctx context.Context) error {
				e := mk()
				return noConn(e.AcceptIn(ctx, e.Term()))
			}},
			{kind + " Endpoint.Addr", func(context.Context) error { return is(mk().Addr(), netip.AddrPort{}) }},
			{kind + " Endpoint.Close", func(context.Context) error { return is(mk().Close(), nil) }},
			{kind + " Endpoint.Close twice", func(context.Context) error {
				e := mk()
				e.Close()
				return is(e.Close(), nil)
			}},
			{kind + " Endpoint.Dial", func(ctx context.Context) error { return noConn(mk().Dial(ctx, "10.0.0.2:7000")) }},
			{kind + " Endpoint.Dial bad address", func(ctx context.Context) error { return noConn(mk().Dial(ctx, "nonsense")) }},
			{kind + " Endpoint.Err", func(context.Context) error { return closedErr(mk().Err()) }},
			{kind + " Endpoint.ResumeAccepting", func(context.Context) error { return is(mk().ResumeAccepting(), xrc.AcceptTerm{}) }},
			{kind + " Endpoint.Stats", func(context.Context) error { return is(mk().Stats(), xrc.Stats{}) }},
			{kind + " Endpoint.StopAccepting", func(context.Context) error { mk().StopAccepting(); return nil }},
			{kind + " Endpoint.Term", func(context.Context) error { return is(mk().Term(), xrc.AcceptTerm{}) }},
		}
	}
	var calls []call
	calls = append(calls, connCalls("nil", func() *xrc.Conn { return nil })...)
	calls = append(calls, connCalls("zero", func() *xrc.Conn { return new(xrc.Conn) })...)
	calls = append(calls, endpointCalls("nil", func() *xrc.Endpoint { return nil })...)
	calls = append(calls, endpointCalls("zero", func() *xrc.Endpoint { return &xrc.Endpoint{} })...)
	// The other exported types with methods are values or errors a call
	// fills in; their zero values answer too.
	calls = append(calls,
		call{"zero RejectReason.String", func(context.Context) error {
			if xrc.RejectReason(0).String() == "" {
				return errors.New("empty")
			}
			return nil
		}},
		call{"zero RejectError", func(context.Context) error {
			e := &xrc.RejectError{}
			_ = e.Error()
			return is(e.Timeout() || e.Temporary(), false)
		}},
	)
	for _, tt := range calls {
		t.Run(tt.name, func(t *testing.T) {
			// The bound catches a call that blocks: a closed object has
			// nothing that could ever wake it.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			done := make(chan error, 1)
			go func() {
				defer func() {
					if r := recover(); r != nil {
						done <- fmt.Errorf("panic: %v", r)
					}
				}()
				done <- tt.f(ctx)
			}()
			select {
			case err := <-done:
				if err != nil {
					t.Error(err)
				}
			case <-ctx.Done():
				t.Error("blocked")
			}
		})
	}
}
