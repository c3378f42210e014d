package xrc

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/goxrc/goxrc/internal/kernel"
)

// holdEstablished, once armed, holds the next ESTABLISHED event (a passive
// link's RTU) until release is closed.
type holdEstablished struct {
	wrapper
	armed   atomic.Bool
	held    chan struct{}
	release chan struct{}
}

func (k *holdEstablished) Event(ctx context.Context, id kernel.ID) (kernel.Event, error) {
	ev, err := k.Kernel.Event(ctx, id)
	if err == nil && ev.Type == kernel.EventEstablished && k.armed.CompareAndSwap(true, false) {
		close(k.held)
		<-k.release
	}
	return ev, err
}

// watchPosts holds b's next Connect (as holdConnect) and, once watching,
// reports the frames b posts: keepalives with imm beat on beats, and any
// frame with imm leg in legPosts.
type watchPosts struct {
	holdConnect
	mu       sync.Mutex
	watching bool
	beat     uint32
	leg      uint32
	beats    chan struct{}
	legPosts int
}

func (k *watchPosts) PostSend(q kernel.QP, wrs []kernel.SendWR) error {
	k.mu.Lock()
	if k.watching {
		for _, wr := range wrs {
			switch {
			case wr.Imm == k.leg:
				k.legPosts++
			case wr.Imm == k.beat && len(wr.Payload) == 1 && wr.Payload[0] == kindHeartbeat:
				select {
				case k.beats <- struct{}{}:
				default:
				}
			}
		}
	}
	k.mu.Unlock()
	return k.Kernel.PostSend(q, wrs)
}

// A dial given up once the acceptor's reciprocal leg is bound here, before
// our first frame: our FIN goes first, then the reverse leg is let go at
// once, the last on its TGT, and the TGT dies. The acceptor, whose half
// had not taken the FIN yet (its receives stalled a moment), sent its
// keepalives on that leg as on any: the next found no TGT, and its whole
// uplink recovered, with no fault anywhere (the chaos explorer's
// fault-free seed 328). An inbound half sends nothing before the dialer's
// first frame, which may be the FIN that ends it.
func TestAbandonedDialReverseLegGetsNothing(t *testing.T) {
	w := newWorld(t)
	ek := &holdEstablished{held: make(chan struct{}), release: make(chan struct{})}
	wk := &watchPosts{holdConnect: holdConnect{held: make(chan struct{}), release: make(chan struct{})}, beats: make(chan struct{}, 16)}
	a := w.wrappedEndpoint("10.0.59.1", 7000, func(k kernel.Kernel) kernel.Kernel { ek.Kernel = k; return ek })
	b := w.wrappedEndpoint("10.0.59.2", 7000, func(k kernel.Kernel) kernel.Kernel { wk.Kernel = k; return wk })
	d := w.endpoint("10.0.59.3", 7000)
	// An idle connection of b's to d, on another uplink: b's janitor's
	// keepalives on it show that it has had its looks.
	_, bd := pair(t, d, b)
	t.Cleanup(func() { close(ek.release); close(wk.release) })
	wk.armed.Store(true) // b's next Connect: its reverse leg's link to a's node
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dialed := make(chan error, 1)
	go func() {
		_, err := a.dialOnce(ctx, b.Addr(), true)
		dialed <- err
	}()
	awaitSetup(t, wk.held, "the reverse leg's request never came")
	ek.armed.Store(true) // the reverse leg's RTU at a, once b's Connect goes
	wk.release <- struct{}{}
	awaitSetup(t, ek.held, "the reverse leg's link never came up")
	var half *Conn
	eventually(t, "b's half's reverse leg up", func() (bool, string) {
		b.mu.Lock()
		defer b.mu.Unlock()
		for c := range b.conns {
			if c.inbound && c.RemoteAddr() == a.Addr() && c.sendUp {
				half = c
				return true, ""
			}
		}
		return false, "not yet"
	})
	b.p.PauseReceives() // our FIN waits in b's SRQ
	defer b.p.ResumeReceives()
	cancel()
	if err := <-dialed; !errors.Is(err, context.Canceled) {
		t.Fatalf("dial: %v, want context.Canceled", err)
	}
	eventually(t, "a's dial ended, and its TGT with it", func() (bool, string) {
		a.mu.Lock()
		defer a.mu.Unlock()
		return len(a.conns) == 0 && w.f.Node("10.0.59.1").Stats().TGTs == 0, "still there"
	})
	b.mu.Lock()
	wk.mu.Lock()
	wk.watching, wk.beat, wk.leg = true, bd.peerTag, half.peerTag
	wk.mu.Unlock()
	b.mu.Unlock()
	// Three keepalives on the idle leg to d, each a heartbeat after the
	// last: by the third the janitor found the reverse leg idle too.
	for range 3 {
		awaitSetup(t, wk.beats, "b's janitor sent no keepalive to d")
	}
	wk.mu.Lock()
	n := wk.legPosts
	wk.mu.Unlock()
	b.p.ResumeReceives()
	eventually(t, "b's half ended by the FIN", func() (bool, string) {
		return b.Stats().Abandoned == 1, "not yet"
	})
	if s := b.Stats(); n != 0 || s.Recoveries != 0 {
		t.Fatalf("b posted %d frames on the reverse leg after a let it go; %+v", n, s)
	}
}
