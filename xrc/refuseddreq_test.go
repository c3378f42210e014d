package xrc

import (
	"context"
	"net/netip"
	"sync"
	"syscall"
	"testing"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/verbs"
)

// refuseDREQ fails the first Disconnect of a physical link's active id
// (an INI's) with the error rdma_disconnect gives for a DREQ the kernel
// will not send; the call is not made.
type refuseDREQ struct {
	wrapper
	active  xrcConnects
	mu      sync.Mutex
	refused bool
}

func (k *refuseDREQ) Connect(ctx context.Context, dst netip.AddrPort, ex kernel.Exchange, qpNum uint32, pd []byte) (kernel.ID, error) {
	id, err := k.Kernel.Connect(ctx, dst, ex, qpNum, pd)
	return k.active.note(id, ex, err)
}

func (k *refuseDREQ) Disconnect(id kernel.ID) error {
	active := k.active.has(id)
	k.mu.Lock()
	refuse := active && !k.refused
	k.refused = k.refused || refuse
	k.mu.Unlock()
	if refuse {
		return &verbs.OpError{Op: "rdma_disconnect", Err: syscall.EINVAL}
	}
	return k.Kernel.Disconnect(id)
}

// xrcConnects remembers the ids of a process's physical links' active
// sides (its INIs' CM ids: Connect on the XRC exchange).
type xrcConnects struct {
	mu  sync.Mutex
	ids map[kernel.ID]bool
}

// note records id if Connect made it on the XRC exchange; it returns
// Connect's results.
func (x *xrcConnects) note(id kernel.ID, ex kernel.Exchange, err error) (kernel.ID, error) {
	if err == nil && ex == kernel.ExchangeXRC {
		x.mu.Lock()
		if x.ids == nil {
			x.ids = map[kernel.ID]bool{}
		}
		x.ids[id] = true
		x.mu.Unlock()
	}
	return id, err
}

func (x *xrcConnects) has(id kernel.ID) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.ids[id]
}

// An uplink nobody uses any more is torn down by its DREQ, and its INI
// destroyed at the TIMEWAIT_EXIT that follows. A DREQ the kernel refuses
// brings no TIMEWAIT_EXIT: the INI and its CM id were held for as long as
// the endpoint lived (TestErrorAnywhere's Disconnect/1 found it). They are
// destroyed at once now, as by the TIMEWAIT_EXIT, and the next dial
// makes a new uplink.
func TestRefusedDisconnectReleasesINI(t *testing.T) {
	w := newWorld(t)
	var k *refuseDREQ
	a := w.wrappedEndpoint("10.0.0.1", 7000, func(inner kernel.Kernel) kernel.Kernel {
		k = &refuseDREQ{wrapper: wrapper{inner}}
		return k
	})
	b := w.endpoint("10.0.0.2", 7000)
	c, d := pair(t, a, b)
	roundTrip(t, c, d, []byte("x"))
	roundTrip(t, d, c, []byte("y"))
	c.Close()
	d.Close()
	requireReleased(t, w, a, b)
	k.mu.Lock()
	refused := k.refused
	k.mu.Unlock()
	if !refused {
		t.Fatal("no DREQ refused: the uplink was not torn down by its Disconnect")
	}
	c, d = pair(t, a, b) // a new uplink
	roundTrip(t, c, d, []byte("again"))
}
