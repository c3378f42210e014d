package xrc

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// qpHold holds the DestroyQP of an INI, once armed, until release.
type qpHold struct {
	wrapper
	mu      sync.Mutex
	inis    map[kernel.QP]bool
	armed   bool
	at      chan struct{}
	release chan struct{}
}

func (k *qpHold) CreateINI() (kernel.QP, uint32, error) {
	qp, num, err := k.Kernel.CreateINI()
	if err == nil {
		k.mu.Lock()
		k.inis[qp] = true
		k.mu.Unlock()
	}
	return qp, num, err
}

func (k *qpHold) DestroyQP(qp kernel.QP) error {
	k.mu.Lock()
	held := k.armed && k.inis[qp]
	if held {
		k.armed = false
	}
	k.mu.Unlock()
	if held {
		k.at <- struct{}{}
		<-k.release
	}
	return k.Kernel.DestroyQP(qp)
}

// Stats counts an INI "until destroyed", as the kernel does: while the
// teardown of a link destroys its INI, the INI is the process's still.
// endINI stopped counting it before its DestroyQP: Stats said 0 uplinks
// where the kernel held 1.
func TestStatsQPsCountINIUntilItsDestroyQP(t *testing.T) {
	w := newWorld(t)
	k := &qpHold{inis: map[kernel.QP]bool{}, at: make(chan struct{}), release: make(chan struct{})}
	a := w.wrappedEndpoint("10.0.71.1", 7000, func(in kernel.Kernel) kernel.Kernel { k.Kernel = in; return k })
	b := w.endpoint("10.0.71.2", 7000)
	node := w.f.Node("10.0.71.1")
	ca, cb := pair(t, a, b)
	k.mu.Lock()
	k.armed = true
	k.mu.Unlock()
	ca.Close()
	cb.Close()
	select {
	case <-k.at:
	case <-time.After(5 * time.Second):
		t.Fatal("the INI was not destroyed")
	}
	var once sync.Once
	release := func() { once.Do(func() { close(k.release) }) }
	defer release()
	// b's FIN makes a's receive loop drop the TGT of b's leg into a
	// meanwhile: Stats and the node, read one after the other, compare
	// once it has gone from both.
	eventually(t, "the TGT dropped", func() (bool, string) {
		s, n := a.Stats(), node.Stats()
		return s.Downlinks == 0 && n.TGTs == 0, fmt.Sprintf("Stats %+v, node %+v", s, n)
	})
	s, n := a.Stats(), node.Stats()
	release()
	if s.Uplinks != n.INIs || s.QPs != n.QPs() {
		t.Errorf("held at the INI's DestroyQP: Stats %d QPs (%d uplinks), the kernel %d (%d INIs)", s.QPs, s.Uplinks, n.QPs(), n.INIs)
	}
	eventually(t, "the INI destroyed and not counted", func() (bool, string) {
		s, n := a.Stats(), node.Stats()
		return s.Uplinks == 0 && n.INIs == 0, fmt.Sprintf("Stats %+v, node %+v", s, n)
	})
}
