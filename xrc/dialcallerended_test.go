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
// it no longer needs) just as the endpoint failed. With heard, it first
// waits for the endpoint's end to reach the dial's context, as the
// engine's die on a failed device may before the kernel looks.
type failingConnect struct {
	kernel.Kernel
	fail, cancel func()
	heard        bool
}

func (g *failingConnect) Connect(ctx context.Context, dst netip.AddrPort, ex kernel.Exchange, qpn uint32, pd []byte) (kernel.ID, error) {
	g.fail()
	if g.heard {
		<-ctx.Done()
	}
	id, err := g.Kernel.Connect(ctx, dst, ex, qpn, pd)
	g.cancel()
	return id, err
}

// A Dial whose context ended as its process died or its device failed
// fails with the endpoint's failure, not the kernel's bare answer: the dead
// process's ErrClosed ("use of closed network connection", which says the
// application closed something) or the failed device's EIO. Dial kept any
// error once the caller's context had ended, its own or not; and where the
// engine's die on the device's failure had ended the dial's context before
// the kernel looked ("heard first"), the kernel's "context canceled".
func TestDialEndedAsEndpointFailsSaysWhy(t *testing.T) {
	for _, tc := range []struct {
		name  string
		want  error
		heard bool
	}{{"process", ErrProcessDied, false}, {"device", ErrDeviceRemoved, false}, {"device heard first", ErrDeviceRemoved, true}} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			b := w.endpoint("10.0.131.2", 7000)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			g := &failingConnect{cancel: cancel, heard: tc.heard}
			a := w.wrappedEndpoint("10.0.131.1", 7000, func(k kernel.Kernel) kernel.Kernel { g.Kernel = k; return g })
			g.fail = a.p.Kill
			if tc.want == ErrDeviceRemoved {
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
