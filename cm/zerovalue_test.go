package cm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"
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
	is := func(got, want any) error {
		if got != want {
			return fmt.Errorf("got %v, want %v", got, want)
		}
		return nil
	}
	buf := make([]byte, 16)
	tests := []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"Conn.Close", func(context.Context) error { return is((&Conn{}).Close(), nil) }},
		{"Conn.CloseWrite", func(context.Context) error { return closed((&Conn{}).CloseWrite()) }},
		{"Conn.Send", func(ctx context.Context) error { return closed((&Conn{}).Send(ctx, buf)) }},
		{"Conn.Send empty", func(ctx context.Context) error { return closed((&Conn{}).Send(ctx, nil)) }},
		{"Conn.SendWithImm", func(ctx context.Context) error { return closed((&Conn{}).SendWithImm(ctx, nil, 1)) }},
		{"Conn.Recv", func(ctx context.Context) error { _, err := (&Conn{}).Recv(ctx, buf); return closed(err) }},
		{"Conn.RecvWithImm", func(ctx context.Context) error {
			_, _, _, err := (&Conn{}).RecvWithImm(ctx, buf)
			return closed(err)
		}},
		{"Conn.RegisterMemory", func(context.Context) error {
			_, err := (&Conn{}).RegisterMemory(4096, RemoteRead)
			return closed(err)
		}},
		{"Conn.WriteRemote", func(ctx context.Context) error {
			return closed((&Conn{}).WriteRemote(ctx, &Region{}, 0, 0, RemoteRegion{}, 0))
		}},
		{"Conn.ReadRemote", func(ctx context.Context) error {
			return closed((&Conn{}).ReadRemote(ctx, &Region{}, 0, 0, RemoteRegion{}, 0))
		}},
		{"Conn.Transport", func(context.Context) error { return is((&Conn{}).Transport(), Transport(0)) }},
		{"Conn.LocalAddr", func(context.Context) error { return is((&Conn{}).LocalAddr(), nil) }},
		{"Conn.Stats", func(context.Context) error { return is((&Conn{}).Stats(), Stats{}) }},
		{"Conn.NetConn Read", func(context.Context) error {
			_, err := (&Conn{}).NetConn().Read(buf)
			if err == io.EOF {
				return errors.New("io.EOF, want ErrClosed")
			}
			return closed(err)
		}},
		{"Conn.NetConn Close", func(context.Context) error { return is((&Conn{}).NetConn().Close(), nil) }},
		{"Listener.Accept", func(ctx context.Context) error { _, err := (&Listener{}).Accept(ctx); return closed(err) }},
		{"Listener.NetListener Accept", func(context.Context) error {
			_, err := (&Listener{}).NetListener().Accept()
			return closed(err)
		}},
		{"Listener.Addr", func(context.Context) error { return is((&Listener{}).Addr(), nil) }},
		{"Listener.Close", func(context.Context) error { return is((&Listener{}).Close(), nil) }},
		{"Region.Close", func(context.Context) error { return is((&Region{}).Close(), nil) }},
		{"Region.Bytes", func(context.Context) error { return is(len((&Region{}).Bytes()), 0) }},
		{"Region.Descriptor", func(context.Context) error { return is((&Region{}).Descriptor(), RemoteRegion{}) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The bound catches a call that blocks: a zero value has
			// nothing that could ever wake it.
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			done := make(chan error, 1)
			go func() {
				defer func() {
					if p := recover(); p != nil {
						done <- fmt.Errorf("panic: %v", p)
					}
				}()
				done <- tt.call(ctx)
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
