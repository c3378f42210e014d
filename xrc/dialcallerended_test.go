package xrc

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	"github.com/goxrc/goxrc/internal/kernel"
)

// failingConnect makes the dial's rdma_connect fail as its process dies or
// its device fails (fail), then ends the Dial's context (cancel) before
// Dial looks at the error: a caller that gave up (net/http cancels a dial
// it no longer needs) just as the endpoint failed.
type failingConnect struct {
	kernel.Kernel
	fail, cancel func()
}

func (g *failingConnect) Connect(ctx context.Context, dst netip.AddrPort, ex kernel.Exchange, qpn uint32, pd []byte) (kernel.ID, error) {
	g.fail()
	id, err := g.Kernel.Connect(ctx, dst, ex, qpn, pd)
	g.cancel()
	return id, err
}

// A Dial whose context ended as its process died or its device failed
// fails with the endpoint's failure, not the kernel's bare answer: the dead
// process's ErrClosed ("use of closed network connection", which says the
// application closed something) or the failed device's EIO. Dial kept any
// error once the caller's context had ended, its own or not.
func TestDialEndedAsEndpointFailsSaysWhy(t *testing.T) {
	for _, tc := range []struct {
		name string
		want error
	}{{"process", ErrProcessDied}, {"device", ErrDeviceRemoved}} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			b := w.endpoint("10.0.131.2", 7000)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			g := &failingConnect{cancel: cancel}
			a := w.wrappedEndpoint("10.0.131.1", 7000, func(k kernel.Kernel) kernel.Kernel { g.Kernel = k; return g })
			g.fail = a.p.Kill
			if tc.name == "device" {
				g.fail = a.p.Node().FailDevice
			}
			c, err := a.Dial(ctx, b.Addr().String())
			if err == nil {
				c.Close()
				t.Fatal("Dial succeeded")
			}
			if !errors.Is(err, tc.want) || errors.Is(err, ErrClosed) {
				t.Fatalf("Dial: %v, want %v", err, tc.want)
			}
		})
	}
}
