package xrc

import (
	"context"
	"fmt"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// iniHold wraps a process's kernel and holds the calls named in holds
// (once each) on the engine's physical links: Connect of an XRC-typed
// exchange (its INI made, its PHYS_REQ not sent), Establish (the INI in
// RTS, its RTU not sent) and DestroyID of such a link's CM id (the INI
// still there). Each held call sends its name on at and waits for release.
type iniHold struct {
	wrapper
	mu      sync.Mutex
	holds   map[string]bool
	ids     map[kernel.ID]bool // the XRC-typed CM ids
	at      chan string
	release chan struct{}
}

func newINIHold() *iniHold {
	return &iniHold{holds: map[string]bool{}, ids: map[kernel.ID]bool{}, at: make(chan string), release: make(chan struct{})}
}

func (k *iniHold) arm(op string) {
	k.mu.Lock()
	k.holds[op] = true
	k.mu.Unlock()
}

func (k *iniHold) hold(op string, id kernel.ID) {
	k.mu.Lock()
	held := k.holds[op] && (id == 0 || k.ids[id])
	if held {
		delete(k.holds, op)
	}
	k.mu.Unlock()
	if held {
		k.at <- op
		<-k.release
	}
}

func (k *iniHold) Connect(ctx context.Context, dst netip.AddrPort, ex kernel.Exchange, qpNum uint32, pd []byte) (kernel.ID, error) {
	if ex != kernel.ExchangeXRC {
		return k.Kernel.Connect(ctx, dst, ex, qpNum, pd)
	}
	k.hold("Connect", 0)
	id, err := k.Kernel.Connect(ctx, dst, ex, qpNum, pd)
	if err == nil {
		k.mu.Lock()
		k.ids[id] = true
		k.mu.Unlock()
	}
	return id, err
}

func (k *iniHold) Establish(id kernel.ID) error {
	k.hold("Establish", id)
	return k.Kernel.Establish(id)
}

func (k *iniHold) DestroyID(id kernel.ID) error {
	k.hold("DestroyID", id)
	return k.Kernel.DestroyID(id)
}

// Stats.QPs is "the QPs this process holds", Uplinks its INIs "until
// destroyed". An INI a dial made was counted only once its physical link's
// whole exchange was over (PHYS_REQ, answer, RTU), and no longer from the
// moment its link's teardown began, before its CM id and the INI were
// destroyed: a monitor saw 0 QPs while the kernel held the INI, for up to a
// handshake timeout in the exchange (or a recovery's new INI not counted
// beside the old one). Each step is held here and the count compared with
// the node's, where this process is the only one.
func TestStatsQPsCountINIBeingMadeAndGoing(t *testing.T) {
	w := newWorld(t)
	k := newINIHold()
	a := w.wrappedEndpoint("10.0.67.1", 7000, func(in kernel.Kernel) kernel.Kernel { k.Kernel = in; return k })
	b := w.endpoint("10.0.67.2", 7000)
	node := w.f.Node("10.0.67.1")
	check := func(where string) {
		t.Helper()
		if s, n := a.Stats(), node.Stats(); s.QPs != n.QPs() || s.Uplinks != n.INIs {
			t.Errorf("%s: Stats %d QPs (%d uplinks), the kernel %d (%d INIs)", where, s.QPs, s.Uplinks, n.QPs(), n.INIs)
		}
	}
	k.arm("Connect")
	k.arm("Establish")
	type res struct {
		c   *Conn
		err error
	}
	dialed := make(chan res, 1)
	go func() {
		c, err := a.Dial(ctxT(t, 5*time.Second), b.Addr().String())
		dialed <- res{c, err}
	}()
	accepted := make(chan *Conn, 1)
	go func() {
		c, _ := b.Accept(ctxT(t, 5*time.Second))
		accepted <- c
	}()
	for range 2 {
		where := <-k.at
		check("held at " + where)
		k.release <- struct{}{}
	}
	r := <-dialed
	if r.err != nil {
		t.Fatal(r.err)
	}
	sc := <-accepted
	if sc == nil {
		t.Fatal("not accepted")
	}
	roundTrip(t, r.c, sc, []byte("up"))
	check("up")

	// The uplink's teardown: the INI's CM id goes first, then the INI.
	k.arm("DestroyID")
	r.c.Close()
	sc.Close()
	select {
	case <-k.at:
	case <-time.After(5 * time.Second):
		t.Fatal("the physical link was not torn down")
	}
	check("held at the link id's DestroyID")
	k.release <- struct{}{}
	eventually(t, "the INI destroyed and not counted", func() (bool, string) {
		s, n := a.Stats(), node.Stats()
		return s.QPs == 0 && n.INIs == 0, ""
	})
}

// A recovery's new INI is the process's from its CreateINI too: while its
// PHYS_REQ's exchange runs, the kernel holds it beside the old one.
func TestStatsQPsCountRecoverysNewINI(t *testing.T) {
	w := newWorld(t)
	k := newINIHold()
	s := w.wrappedEndpoint("10.0.69.1", 7000, func(in kernel.Kernel) kernel.Kernel { k.Kernel = in; return k }, longTimers)
	r1 := w.endpoint("10.0.69.2", 7001, longTimers)
	r2 := w.endpoint("10.0.69.2", 7002, longTimers)
	s1, _ := pair(t, s, r1)
	s2, c2 := pair(t, s, r2)
	node := w.f.Node("10.0.69.1")
	k.arm("Connect") // the recovery's PHYS_REQ to r2
	r1.p.Kill()
	sendDone := make(chan error, 1)
	go func() { sendDone <- sendErr(t, s1) }() // the failed send starts the recovery
	select {
	case <-k.at:
	case <-time.After(5 * time.Second):
		t.Fatal("no recovery")
	}
	if st, n := s.Stats(), node.Stats(); st.Uplinks != n.INIs || n.INIs != 2 {
		t.Errorf("during the recovery's exchange: Stats %d uplinks, the kernel %d INIs (want 2: the old and the new)", st.Uplinks, n.INIs)
	}
	k.release <- struct{}{}
	<-sendDone
	roundTrip(t, s2, c2, []byte("after the recovery"))
	eventually(t, "the old INI destroyed and the counts equal", func() (bool, string) {
		st, n := s.Stats(), node.Stats()
		return st.Uplinks == 1 && n.INIs == 1 && st.QPs == n.QPs(), fmt.Sprintf("Stats %+v, node %+v", st, n)
	})
}
