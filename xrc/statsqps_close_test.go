package xrc

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// timewaitHold is qpHold whose INIs' CM ids never report TIMEWAIT_EXIT, as
// on a device whose time-wait (seconds) outlasts what follows: a link
// torn down stays in time-wait, its INI held, until the endpoint's Close
// destroys it.
type timewaitHold struct {
	qpHold
	xrc xrcConnects
}

func (k *timewaitHold) Connect(ctx context.Context, dst netip.AddrPort, ex kernel.Exchange, qpNum uint32, pd []byte) (kernel.ID, error) {
	id, err := k.Kernel.Connect(ctx, dst, ex, qpNum, pd)
	return k.xrc.note(id, ex, err)
}

func (k *timewaitHold) Event(ctx context.Context, id kernel.ID) (kernel.Event, error) {
	for {
		ev, err := k.Kernel.Event(ctx, id)
		if err != nil || ev.Type != kernel.EventTimewaitExit || !k.xrc.has(id) {
			return ev, err
		}
	}
}

// Stats counts an INI until its DestroyQP returns, also the ones Close
// destroys (release): a link still in time-wait as the endpoint closes, or
// one whose id Close took from its watcher. release took the uplinks off
// the endpoint before destroying their INIs: Stats said 0 uplinks while
// the kernel held them.
func TestStatsQPsCountINIUntilCloseDestroysIt(t *testing.T) {
	w := newWorld(t)
	k := &timewaitHold{qpHold: qpHold{inis: map[kernel.QP]bool{}, at: make(chan struct{}), release: make(chan struct{})}}
	a := w.wrappedEndpoint("10.0.72.1", 7000, func(in kernel.Kernel) kernel.Kernel { k.Kernel = in; return k })
	b := w.endpoint("10.0.72.2", 7000)
	node := w.f.Node("10.0.72.1")
	ca, cb := pair(t, a, b)
	roundTrip(t, ca, cb, []byte("x"))
	ca.Close()
	cb.Close()
	// The uplink torn down, its INI in time-wait: still the process's.
	eventually(t, "the uplink torn down, its INI kept for the time-wait", func() (bool, string) {
		s, n := a.Stats(), node.Stats()
		return s.Conns == 0 && s.Uplinks == 1 && n.INIs == 1, fmt.Sprintf("Stats %+v, node %+v", s, n)
	})
	k.mu.Lock()
	k.armed = true
	k.mu.Unlock()
	closed := make(chan struct{})
	go func() { a.Close(); close(closed) }()
	select {
	case <-k.at:
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not destroy the INI")
	}
	s, n := a.Stats(), node.Stats()
	close(k.release)
	<-closed
	if s.Uplinks != n.INIs {
		t.Errorf("Close held at the INI's DestroyQP: Stats %d uplinks, the kernel %d INIs", s.Uplinks, n.INIs)
	}
	if s, n := a.Stats(), node.Stats(); s.Uplinks != 0 || n.INIs != 0 {
		t.Errorf("after Close: Stats %d uplinks, the kernel %d INIs", s.Uplinks, n.INIs)
	}
}
