package xrc

import (
	"context"
	"fmt"
	"net/netip"
	"testing"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/xrc/internal/wire"
)

// holdAbort is failINIs whose process's first ABORT is held in Connect
// until release is closed.
type holdAbort struct {
	failINIs
	held    chan struct{}
	release chan struct{}
}

func (k *holdAbort) Connect(ctx context.Context, dst netip.AddrPort, ex kernel.Exchange, qpNum uint32, pd []byte) (kernel.ID, error) {
	var r wire.Req
	if ex == kernel.ExchangeSIDR && wire.DecodeReq(pd, wire.TypeVirtReq, &r) == nil && r.Flags&wire.FlagAbort != 0 {
		select {
		case <-k.held:
		default:
			close(k.held)
			<-k.release
		}
	}
	return k.Kernel.Connect(ctx, dst, ex, qpNum, pd)
}

// An ABORT that names a dial given up whose FIN is still to go is answered
// once the FIN has gone, as the reverse leg's request is (see
// TestDialAbandonedFINBeforeRefusal): the answer ends the acceptor's half,
// which lets the forward leg go, here the last on its TGT, and the FIN,
// still to go, found no TGT: the dialer's uplink recovered with no fault.
func TestDialAbandonedFINBeforeAbortAnswer(t *testing.T) {
	w := newWorld(t)
	fk := &holdFIN{held: make(chan struct{}), release: make(chan struct{})}
	bk := &holdAbort{held: make(chan struct{}), release: make(chan struct{})}
	a := w.wrappedEndpoint("10.0.105.1", 7000, func(k kernel.Kernel) kernel.Kernel { fk.Kernel = k; return fk })
	b := w.wrappedEndpoint("10.0.105.2", 7000, func(k kernel.Kernel) kernel.Kernel { bk.Kernel = k; return bk })
	bk.armed.Store(true) // b makes no INI: its reverse leg fails, and it sends an ABORT
	abandonDialHoldingFIN(t, a, b, fk, bk.held, "b sent no ABORT")
	close(bk.release) // the ABORT arrives while the FIN waits; answered, b's half ends
	finishAbandonedDial(t, a, b, fk)
	bk.armed.Store(false)
	// (a's kernel, holdFIN, counts no handles: only its node is looked at.)
	eventually(t, "a's node empty", func() (bool, string) {
		s := w.f.Node("10.0.105.1").Stats()
		return s.QPs() == 0 && s.TGTHandles == 0, fmt.Sprintf("%+v", s)
	})
	requireReleased(t, w, b)
}
