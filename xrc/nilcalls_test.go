package xrc_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"testing"

	"github.com/goxrc/goxrc/internal/conntest"
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
	is := conntest.Is
	type call = conntest.ClosedCall
	connCalls := func(kind string, mk func() *xrc.Conn) []call {
		return []call{
			{Name: kind + " Conn.Close", F: func(context.Context) error { return is(mk().Close(), nil) }},
			{Name: kind + " Conn.CloseWrite", F: func(context.Context) error { return closedErr(mk().CloseWrite()) }},
			{Name: kind + " Conn.CreditFrames", F: func(context.Context) error { return is(mk().CreditFrames(), uint64(0)) }},
			{Name: kind + " Conn.Err", F: func(context.Context) error { return is(mk().Err(), nil) }},
			{Name: kind + " Conn.LocalAddr", F: func(context.Context) error { return is(mk().LocalAddr(), netip.AddrPort{}) }},
			{Name: kind + " Conn.MaxMessageSize", F: func(context.Context) error { return is(mk().MaxMessageSize(), 0) }},
			{Name: kind + " Conn.MaxRecvSize", F: func(context.Context) error { return is(mk().MaxRecvSize(), 0) }},
			{Name: kind + " Conn.Recv", F: func(ctx context.Context) error {
				n, err := mk().Recv(ctx, buf)
				if n != 0 {
					return fmt.Errorf("n %d", n)
				}
				return closedErr(err)
			}},
			{Name: kind + " Conn.RemoteAddr", F: func(context.Context) error { return is(mk().RemoteAddr(), netip.AddrPort{}) }},
			{Name: kind + " Conn.Send", F: func(ctx context.Context) error { return closedErr(mk().Send(ctx, buf)) }},
			{Name: kind + " Conn.Send empty", F: func(ctx context.Context) error { return closedErr(mk().Send(ctx, nil)) }},
			{Name: kind + " Conn.Send too long", F: func(ctx context.Context) error {
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
			{Name: kind + " Endpoint.Accept", F: func(ctx context.Context) error { return noConn(mk().Accept(ctx)) }},
			{Name: kind + " Endpoint.AcceptIn", F: func(ctx context.Context) error { return noConn(mk().AcceptIn(ctx, xrc.AcceptTerm{})) }},
			{Name: kind + " Endpoint.AcceptIn its Term", F: func(ctx context.Context) error {
				e := mk()
				return noConn(e.AcceptIn(ctx, e.Term()))
			}},
			{Name: kind + " Endpoint.Addr", F: func(context.Context) error { return is(mk().Addr(), netip.AddrPort{}) }},
			{Name: kind + " Endpoint.Close", F: func(context.Context) error { return is(mk().Close(), nil) }},
			{Name: kind + " Endpoint.Close twice", F: func(context.Context) error {
				e := mk()
				e.Close()
				return is(e.Close(), nil)
			}},
			{Name: kind + " Endpoint.Dial", F: func(ctx context.Context) error { return noConn(mk().Dial(ctx, "10.0.0.2:7000")) }},
			{Name: kind + " Endpoint.Dial bad address", F: func(ctx context.Context) error { return noConn(mk().Dial(ctx, "nonsense")) }},
			{Name: kind + " Endpoint.Err", F: func(context.Context) error { return closedErr(mk().Err()) }},
			{Name: kind + " Endpoint.ResumeAccepting", F: func(context.Context) error { return is(mk().ResumeAccepting(), xrc.AcceptTerm{}) }},
			{Name: kind + " Endpoint.Stats", F: func(context.Context) error { return is(mk().Stats(), xrc.Stats{}) }},
			{Name: kind + " Endpoint.StopAccepting", F: func(context.Context) error { mk().StopAccepting(); return nil }},
			{Name: kind + " Endpoint.Term", F: func(context.Context) error { return is(mk().Term(), xrc.AcceptTerm{}) }},
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
		call{Name: "zero RejectReason.String", F: func(context.Context) error {
			if xrc.RejectReason(0).String() == "" {
				return errors.New("empty")
			}
			return nil
		}},
		call{Name: "zero RejectError", F: func(context.Context) error {
			e := &xrc.RejectError{}
			_ = e.Error()
			return is(e.Timeout() || e.Temporary(), false)
		}},
	)
	conntest.ClosedCalls(t, calls)
}
