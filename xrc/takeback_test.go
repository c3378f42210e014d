package xrc

import (
	"context"
	"errors"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// fullForData finds the send queue full (ENOMEM) for the data frames of the
// leg whose receiver tag is tag, once armed.
type fullForData struct {
	wrapper
	tag   atomic.Uint32
	armed atomic.Bool
}

func (k *fullForData) PostSend(q kernel.QP, wrs []kernel.SendWR) error {
	if k.armed.Load() && len(wrs) == 1 && wrs[0].Imm == k.tag.Load() && len(wrs[0].Payload) > 0 && wrs[0].Payload[0] == kindData {
		return syscall.ENOMEM
	}
	return k.wrapper.PostSend(q, wrs)
}

// A Send whose context ends while its frame waits for room in a full send
// queue takes the frame back, and with it what the frame changed of its
// leg's last frame: the time the janitor counts a heartbeat from, and the
// frame it waits on. It left the time moved on, so Sends taken back one
// after another, nothing of theirs posted, held the leg's keepalive back
// for as long as they went on (20 heartbeats and more, found by a review),
// and its receiver could take the live sender for dead.
func TestDataPathSendTakenBackLeavesKeepaliveDue(t *testing.T) {
	w := newWorld(t)
	w.f.AddNode("10.0.191.2", memfabric.NodeConfig{SRQReceives: 1})
	k := &fullForData{}
	s := w.wrappedEndpoint("10.0.191.1", 7000, func(kk kernel.Kernel) kernel.Kernel { k.wrapper = wrapper{kk}; return k }, longTimers)
	r := w.endpoint("10.0.191.2", 7000, longTimers)
	x, _ := pair(t, s, r)
	y, _ := pair(t, s, r)
	// y's second message waits at the INI (r takes nothing): a frame in
	// the queue, so x's Send waits for room rather than taking the INI
	// for broken.
	r.p.PauseReceives()
	ctx := ctxT(t, 5*time.Second)
	for i := range 2 {
		if err := y.Send(ctx, []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	type last struct {
		sent time.Time
		q    *iniQP
		wr   uint64
	}
	lastOf := func() last {
		s.mu.Lock()
		defer s.mu.Unlock()
		return last{x.lastSent, x.lastQ, x.lastWR}
	}
	s.mu.Lock()
	k.tag.Store(x.peerTag)
	s.mu.Unlock()
	k.armed.Store(true)
	for range 3 {
		before := lastOf()
		short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
		err := x.Send(short, []byte("x"))
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("send into the full queue: %v, want its deadline", err)
		}
		if after := lastOf(); after != before {
			t.Fatalf("x's last frame %+v after a Send taken back, want %+v as before it", after, before)
		}
	}
}
