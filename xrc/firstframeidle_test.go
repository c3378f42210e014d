package xrc

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// holdFirst, once armed, holds the next keepalive's post that is not for
// the peer tag skip (another connection's) until release is closed: a
// dial's first frame waits for room in its INI's full send queue.
type holdFirst struct {
	kernel.Kernel
	skip    atomic.Uint32
	armed   atomic.Bool
	held    chan struct{}
	release chan struct{}
}

func (k *holdFirst) PostSend(q kernel.QP, wrs []kernel.SendWR) error {
	if len(wrs) == 1 && len(wrs[0].Payload) > 0 && wrs[0].Payload[0] == kindHeartbeat && wrs[0].Imm != k.skip.Load() &&
		k.armed.CompareAndSwap(true, false) {
		close(k.held)
		<-k.release
	}
	return k.Kernel.PostSend(q, wrs)
}

// A dial whose first frame is slow to go (its INI's send queue full) for
// longer than the dialer's idle timeout, to an acceptor that waits longer
// for it (a larger idle timeout of its own): the acceptor's half was alive
// all along, but sent no keepalive on its reverse leg before the first
// frame, and the dialer took that leg for dead.
func TestDialFirstFrameLateReverseLegLives(t *testing.T) {
	for _, two := range []bool{false, true} {
		t.Run(fmt.Sprintf("two exchanges %v", two), func(t *testing.T) {
			w := newWorld(t)
			hk := &holdFirst{held: make(chan struct{}), release: make(chan struct{})}
			a := w.wrappedEndpoint("10.0.159.1", 7000, func(k kernel.Kernel) kernel.Kernel { hk.Kernel = k; return hk })
			b := w.endpoint("10.0.159.2", 7000, func(c *Config) { c.IdleTimeout = 20 * testIdle })
			c0, d0 := pair(t, a, b) // the uplinks both ways (a one-exchange dial needs b's)
			defer c0.Close()
			defer d0.Close()
			a.mu.Lock()
			hk.skip.Store(c0.peerTag)
			a.mu.Unlock()
			hk.armed.Store(true)
			dialed := make(chan dialResult, 1)
			go func() {
				c, err := a.dialOnce(ctxT(t, 10*time.Second), b.Addr(), two)
				dialed <- dialResult{c, err}
			}()
			awaitSetup(t, hk.held, "the dial sent no first frame")
			// Held past a's idle timeout (a few heartbeats more), or
			// until a has given the dial up.
			for deadline := time.Now().Add(testIdle + 4*testHeartbeat); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
				a.mu.Lock()
				failed := false
				for c := range a.conns {
					if c != c0 && c.err != nil {
						failed = true
					}
				}
				a.mu.Unlock()
				if failed {
					break
				}
			}
			close(hk.release)
			c, d := upBothWays(t, dialed, b)
			c.Close()
			d.Close()
		})
	}
}
