package cm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"

	"github.com/goxrc/goxrc/internal/conntest"
)

// TestZeroValues: a zero Conn, Listener or Region is a closed one, as a nil
// one is: no call panics or blocks, Close does nothing, the others fail with
// ErrClosed (or give their zero values), as net.TCPConn's do on a zero value.
func TestZeroValues(t *testing.T) {
	closed := func(err error) error {
		if !errors.Is(err, ErrClosed) {
			return fmt.Errorf("err %v, want ErrClosed", err)
		}
		return nil
	}
	is := conntest.Is
	buf := make([]byte, 16)
	tests := []conntest.ClosedCall{
		{Name: "Conn.Close", F: func(context.Context) error { return is((&Conn{}).Close(), nil) }},
		{Name: "Conn.CloseWrite", F: func(context.Context) error { return closed((&Conn{}).CloseWrite()) }},
		{Name: "Conn.Send", F: func(ctx context.Context) error { return closed((&Conn{}).Send(ctx, buf)) }},
		{Name: "Conn.Send empty", F: func(ctx context.Context) error { return closed((&Conn{}).Send(ctx, nil)) }},
		{Name: "Conn.SendWithImm", F: func(ctx context.Context) error { return closed((&Conn{}).SendWithImm(ctx, nil, 1)) }},
		{Name: "Conn.Recv", F: func(ctx context.Context) error { _, err := (&Conn{}).Recv(ctx, buf); return closed(err) }},
		{Name: "Conn.RecvWithImm", F: func(ctx context.Context) error {
			_, _, _, err := (&Conn{}).RecvWithImm(ctx, buf)
			return closed(err)
		}},
		{Name: "Conn.RegisterMemory", F: func(context.Context) error {
			_, err := (&Conn{}).RegisterMemory(4096, RemoteRead)
			return closed(err)
		}},
		{Name: "Conn.WriteRemote", F: func(ctx context.Context) error {
			return closed((&Conn{}).WriteRemote(ctx, &Region{}, 0, 0, RemoteRegion{}, 0))
		}},
		{Name: "Conn.ReadRemote", F: func(ctx context.Context) error {
			return closed((&Conn{}).ReadRemote(ctx, &Region{}, 0, 0, RemoteRegion{}, 0))
		}},
		{Name: "Conn.Transport", F: func(context.Context) error { return is((&Conn{}).Transport(), Transport(0)) }},
		{Name: "Conn.LocalAddr", F: func(context.Context) error { return is((&Conn{}).LocalAddr(), nil) }},
		{Name: "Conn.Stats", F: func(context.Context) error { return is((&Conn{}).Stats(), Stats{}) }},
		{Name: "Conn.NetConn Read", F: func(context.Context) error {
			_, err := (&Conn{}).NetConn().Read(buf)
			if err == io.EOF {
				return errors.New("io.EOF, want ErrClosed")
			}
			return closed(err)
		}},
		{Name: "Conn.NetConn Close", F: func(context.Context) error { return is((&Conn{}).NetConn().Close(), nil) }},
		{Name: "Listener.Accept", F: func(ctx context.Context) error { _, err := (&Listener{}).Accept(ctx); return closed(err) }},
		{Name: "Listener.NetListener Accept", F: func(context.Context) error {
			_, err := (&Listener{}).NetListener().Accept()
			return closed(err)
		}},
		{Name: "Listener.Addr", F: func(context.Context) error { return is((&Listener{}).Addr(), nil) }},
		{Name: "Listener.Close", F: func(context.Context) error { return is((&Listener{}).Close(), nil) }},
		{Name: "Region.Close", F: func(context.Context) error { return is((&Region{}).Close(), nil) }},
		{Name: "Region.Bytes", F: func(context.Context) error { return is(len((&Region{}).Bytes()), 0) }},
		{Name: "Region.Descriptor", F: func(context.Context) error { return is((&Region{}).Descriptor(), RemoteRegion{}) }},
	}
	conntest.ClosedCalls(t, tests)
}

// A zero Region given to a live connection's one-sided operations is a
// closed one there too: it posted a zero-length operation on the fake
// transport (a device refused it as another transport's region).
func TestZeroRegionOnLiveConn(t *testing.T) {
	a, b, _ := fakePair(t, fakeOpts{})
	ctx := ctxT(t)
	r, err := b.RegisterMemory(64, RemoteRead|RemoteWrite)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for name, err := range map[string]error{
		"WriteRemote": a.WriteRemote(ctx, &Region{}, 0, 0, r.Descriptor(), 0),
		"ReadRemote":  a.ReadRemote(ctx, &Region{}, 0, 0, r.Descriptor(), 0),
	} {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s with a zero Region: %v, want ErrClosed", name, err)
		}
	}
	// The connection is not the one closed.
	roundTrip := []byte("still up")
	if err := a.Send(ctx, roundTrip); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	if n, err := b.Recv(ctx, buf); err != nil || string(buf[:n]) != string(roundTrip) {
		t.Fatalf("recv: %q, %v", buf[:n], err)
	}
}
