package xrc

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// iniCreateHold holds the first CreateINI after arm, once the kernel has
// made the INI, until release.
type iniCreateHold struct {
	wrapper
	armed   atomic.Bool
	at      chan struct{}
	release chan struct{}
}

func (k *iniCreateHold) CreateINI() (kernel.QP, uint32, error) {
	qp, num, err := k.Kernel.CreateINI()
	if err == nil && k.armed.CompareAndSwap(true, false) {
		close(k.at)
		<-k.release
	}
	return qp, num, err
}

// Stats counts an INI "from its creation (a link being set up) until
// destroyed", as the kernel does: while the CreateINI that makes a link's
// INI returns, the INI is the process's already. physLink counted it only
// once CreateINI had returned: Stats said 0 uplinks where the kernel held 1
// (the mirror of TestStatsQPsCountINIUntilItsDestroyQP).
func TestStatsQPsCountINIFromItsCreateINI(t *testing.T) {
	w := newWorld(t)
	k := &iniCreateHold{at: make(chan struct{}), release: make(chan struct{})}
	a := w.wrappedEndpoint("10.0.72.1", 7000, func(in kernel.Kernel) kernel.Kernel { k.Kernel = in; return k })
	b := w.endpoint("10.0.72.2", 7000)
	node := w.f.Node("10.0.72.1")
	k.armed.Store(true)
	done := make(chan error, 2)
	go func() {
		_, err := b.Accept(ctxT(t, 5*time.Second))
		done <- err
	}()
	go func() {
		_, err := a.Dial(ctxT(t, 5*time.Second), b.Addr().String())
		done <- err
	}()
	select {
	case <-k.at:
	case <-time.After(5 * time.Second):
		close(k.release)
		t.Fatal("no INI was created")
	}
	s, n := a.Stats(), node.Stats()
	close(k.release)
	if s.Uplinks != n.INIs {
		t.Errorf("held at the INI's CreateINI: Stats %d uplinks, the kernel %d INIs", s.Uplinks, n.INIs)
	}
	for range 2 {
		if err := <-done; err != nil {
			t.Fatalf("dial or accept: %v", err)
		}
	}
	eventually(t, "the link up and counted", func() (bool, string) {
		s, n := a.Stats(), node.Stats()
		return s.Uplinks == n.INIs && n.INIs == 1, fmt.Sprintf("Stats %+v, node %+v", s, n)
	})
}
