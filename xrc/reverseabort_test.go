package xrc

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// failINIs, while armed, fails every CreateINI with ENOMEM: the node is out
// of QPs as the acceptor opens its reverse leg to the dialer's node.
type failINIs struct {
	wrapper
	armed atomic.Bool
	tries atomic.Int32
}

func (k *failINIs) CreateINI() (kernel.QP, uint32, error) {
	if k.armed.Load() {
		k.tries.Add(1)
		return 0, 0, syscall.ENOMEM
	}
	return k.Kernel.CreateINI()
}

// dialAborted arms k, the kernel of b's process, and dials b from a: b can
// make no INI for the dial's reverse leg, so the dial must fail; it
// returns the dial's error.
func (k *failINIs) dialAborted(t *testing.T, a, b *proc) error {
	t.Helper()
	k.armed.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := a.Dial(ctx, b.Addr().String())
	if err == nil {
		c.Close()
		t.Fatal("dial succeeded, though the acceptor could make no INI for its reverse leg")
	}
	return err
}

// A dial whose acceptor cannot open the reverse leg for reasons of its own
// (here its node is out of QPs) fails at once with that reason's name, not
// at its deadline: the acceptor's half fails and sends an ABORT naming the
// dial. Until then the dialer heard nothing and waited out its handshake
// timeout (DeadlineExceeded).
func TestDialReverseLegAbortedFailsAtOnce(t *testing.T) {
	for _, virt := range []bool{false, true} {
		t.Run(fmt.Sprintf("forward leg virtual %v", virt), func(t *testing.T) {
			w := newWorld(t)
			a := w.endpoint("10.0.101.1", 7000, func(c *Config) { c.HandshakeTimeout = time.Hour })
			k := &failINIs{}
			b := w.wrappedEndpoint("10.0.101.2", 7000, func(kk kernel.Kernel) kernel.Kernel { k.Kernel = kk; return k },
				func(c *Config) { c.HandshakeTimeout = 2 * time.Second })
			var others []*Conn
			if virt {
				// a's uplink to b's node, made for another process
				// there: the dial's forward leg is a VIRT_REQ, and b,
				// with no uplink of its own to a's node, needs an INI
				// for its reverse leg all the same.
				o := w.endpoint("10.0.101.2", 7001)
				c, d := pair(t, a, o)
				others = append(others, c, d)
			}
			start := time.Now()
			err := k.dialAborted(t, a, b)
			if !errors.Is(err, errReverseAborted) {
				t.Fatalf("dial failed after %v with %v; want the acceptor's ABORT", time.Since(start).Round(time.Millisecond), err)
			}
			if !errors.Is(err, syscall.ECONNREFUSED) {
				t.Fatalf("dial failed with %v, which does not match ECONNREFUSED as the acceptor's other refusals do", err)
			}
			if k.tries.Load() == 0 {
				t.Fatal("setup: the acceptor never tried to make an INI")
			}
			k.armed.Store(false)
			requireNoHalfConn(t, b)
			for _, c := range others {
				c.Close()
			}
			requireReleased(t, w, a, b)
		})
	}
}
