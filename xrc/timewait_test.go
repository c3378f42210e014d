package xrc

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// timewaitGate holds back every TIMEWAIT_EXIT the engine reads until
// release is closed, and tells seen of the first one.
type timewaitGate struct {
	wrapper
	seen, release chan struct{}
	once          sync.Once
}

// Handles lets requireReleased read the engine's kernel handles through the gate.
func (g *timewaitGate) Event(ctx context.Context, id kernel.ID) (kernel.Event, error) {
	ev, err := g.Kernel.Event(ctx, id)
	if err == nil && ev.Type == kernel.EventTimewaitExit {
		g.once.Do(func() { close(g.seen) })
		select {
		case <-g.release:
		case <-ctx.Done():
			return kernel.Event{}, ctx.Err()
		}
	}
	return ev, err
}

// An uplink nobody uses any more is disconnected, and its INI destroyed
// only after the physical link's TIMEWAIT_EXIT (the issue: "FIN-based
// teardown that destroys an INI only after TIMEWAIT_EXIT"). The model
// delivers TIMEWAIT_EXIT at once, so no test could tell an INI destroyed at
// the disconnect from one destroyed at TIMEWAIT_EXIT; here the event is
// held: the INI must outlive the disconnect, and go once the event comes.
func TestINIDestroyedOnlyAfterTimewaitExit(t *testing.T) {
	w := newWorld(t)
	g := &timewaitGate{seen: make(chan struct{}), release: make(chan struct{})}
	a := w.wrappedEndpoint("10.0.7.1", 7000, func(k kernel.Kernel) kernel.Kernel { g.Kernel = k; return g })
	b := w.endpoint("10.0.7.2", 7000)
	ca, cb := pair(t, a, b)
	roundTrip(t, ca, cb, []byte("before the FIN"))
	roundTrip(t, cb, ca, []byte("and back"))
	nodeA := w.f.Node("10.0.7.1")
	if st := nodeA.Stats(); st.INIs != 1 {
		t.Fatalf("node A before close: %+v, want its one INI", st)
	}
	if err := ca.Close(); err != nil {
		t.Fatal(err)
	}
	if err := cb.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-g.seen:
	case <-time.After(5 * time.Second):
		t.Fatal("the uplink was never disconnected")
	}
	// The disconnect is done, its TIMEWAIT_EXIT is held: the INI stays.
	time.Sleep(50 * time.Millisecond)
	if st := nodeA.Stats(); st.INIs != 1 {
		t.Fatalf("node A in timewait: %+v, want the INI kept until TIMEWAIT_EXIT", st)
	}
	close(g.release)
	eventually(t, "the INI destroyed after TIMEWAIT_EXIT", func() (bool, string) {
		st := nodeA.Stats()
		return st.INIs == 0, fmt.Sprintf("%+v", st)
	})
	requireReleased(t, w, a, b)
}
