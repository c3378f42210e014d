package xrc

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// fullFor finds the send queue full (ENOMEM) for the frames of a kind (data
// unless set) of the leg whose receiver tag is tag, once armed.
type fullFor struct {
	wrapper
	kind  byte
	tag   atomic.Uint32
	armed atomic.Bool
}

func (k *fullFor) PostSend(q kernel.QP, wrs []kernel.SendWR) error {
	kind := k.kind
	if kind == 0 {
		kind = kindData
	}
	if k.armed.Load() && len(wrs) == 1 && wrs[0].Imm == k.tag.Load() && len(wrs[0].Payload) > 0 && wrs[0].Payload[0] == kind {
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
	k := &fullFor{}
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

// A keepalive whose post finds the send queue full goes later, and leaves
// the leg's last frame as it was: the data frame still waiting before it.
// It left the keepalive named there, gone from the queue's waiters, so the
// janitor took the leg for one whose frames had all gone and queued
// another keepalive behind the waiting frame.
func TestDataPathFullKeepaliveLeavesLastFrame(t *testing.T) {
	w := newWorld(t)
	k := &fullFor{kind: kindHeartbeat}
	s, x := waitingMessage(t, w, "10.0.192.1", "10.0.192.2", func(kk kernel.Kernel) kernel.Kernel { k.wrapper = wrapper{kk}; return k })
	s.mu.Lock()
	k.tag.Store(x.peerTag)
	s.mu.Unlock()
	k.armed.Store(true)
	if res, _, _ := x.post(kindHeartbeat, nil, nil); res == posted {
		t.Fatal("the keepalive was posted into a full queue")
	}
	s.mu.Lock()
	waiting := x.frameWaitingLocked()
	s.mu.Unlock()
	if !waiting {
		t.Fatal("after a keepalive that did not go, x's waiting message is no longer its last frame: the janitor would queue a keepalive behind it")
	}
}

// heldFull finds the send queue full (ENOMEM) for the frames of the leg
// whose receiver tag is tag, once armed: at once for data, and for a
// keepalive only once the test lets its post go on (entered says it is
// held), so that a Send's take-back can fall inside it.
type heldFull struct {
	wrapper
	tag       atomic.Uint32
	armed     atomic.Bool
	dataTries atomic.Int32
	entered   chan struct{}
	release   chan struct{}
}

func (k *heldFull) PostSend(q kernel.QP, wrs []kernel.SendWR) error {
	if k.armed.Load() && len(wrs) == 1 && wrs[0].Imm == k.tag.Load() && len(wrs[0].Payload) > 0 {
		switch wrs[0].Payload[0] {
		case kindData:
			k.dataTries.Add(1)
			return syscall.ENOMEM
		case kindHeartbeat:
			k.entered <- struct{}{}
			<-k.release
			return syscall.ENOMEM
		}
	}
	return k.wrapper.PostSend(q, wrs)
}

// A Send and a keepalive that both find the send queue full and both go
// later, their take-backs interleaved, leave the leg's last frame at the
// frame before them that still waits. Each set it back to the frame it
// had found there: the second to go back named the first, gone from the
// queue's waiters, so the janitor took the leg for one whose frames had
// all gone and could queue a keepalive behind the waiting message.
func TestDataPathInterleavedTakeBacksLeaveLastFrame(t *testing.T) {
	for i, keepaliveFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("keepalive first %v", keepaliveFirst), func(t *testing.T) {
			w := newWorld(t)
			k := &heldFull{entered: make(chan struct{}), release: make(chan struct{})}
			s, x := waitingMessage(t, w, fmt.Sprintf("10.0.193.%d", 2*i+1), fmt.Sprintf("10.0.193.%d", 2*i+2),
				func(kk kernel.Kernel) kernel.Kernel { k.wrapper = wrapper{kk}; return k })
			s.mu.Lock()
			k.tag.Store(x.peerTag)
			s.mu.Unlock()
			k.armed.Store(true)
			ctx := ctxT(t, 5*time.Second)
			beat := make(chan postResult, 1)
			startBeat := func() {
				go func() {
					res, _, _ := x.post(kindHeartbeat, nil, nil)
					beat <- res
				}()
				select {
				case <-k.entered:
				case <-ctx.Done():
					t.Fatal("the keepalive never reached its post")
				}
			}
			sendCtx, cancelSend := context.WithCancel(ctx)
			defer cancelSend()
			sent := make(chan error, 1)
			startSend := func() {
				go func() { sent <- x.Send(sendCtx, []byte("y")) }()
				eventually(t, "the Send finds the queue full", func() (bool, string) {
					return k.dataTries.Load() > 0, "no data post tried"
				})
			}
			takeBackSend := func() {
				cancelSend()
				if err := <-sent; !errors.Is(err, context.Canceled) {
					t.Fatalf("send into the full queue: %v, want its context's end", err)
				}
			}
			takeBackBeat := func() {
				close(k.release)
				if res := <-beat; res == posted {
					t.Fatal("the keepalive was posted into a full queue")
				}
			}
			if keepaliveFirst {
				startBeat()
				startSend()
				takeBackBeat()
				takeBackSend()
			} else {
				startSend()
				startBeat()
				takeBackSend()
				takeBackBeat()
			}
			s.mu.Lock()
			waiting := x.frameWaitingLocked()
			q, wr := x.lastQ, x.lastWR
			s.mu.Unlock()
			if !waiting {
				t.Fatalf("after a Send and a keepalive that did not go, x's last frame is request %d on %p, not in the queue: the janitor would queue a keepalive behind its waiting message", wr, q)
			}
		})
	}
}

// waitingMessage makes s (its kernel wrapped by wrap) on sIP and a receiver
// on rIP whose SRQ holds one receive, and two connections from s to it: y
// fills that receive and queues a message behind it, and x one more, so
// that x's newest frame waits at the INI (the receiver takes nothing).
func waitingMessage(t *testing.T, w *world, sIP, rIP string, wrap func(kernel.Kernel) kernel.Kernel) (s *proc, x *Conn) {
	t.Helper()
	w.f.AddNode(rIP, memfabric.NodeConfig{SRQReceives: 1})
	s = w.wrappedEndpoint(sIP, 7000, wrap, longTimers)
	r := w.endpoint(rIP, 7000, longTimers)
	x, _ = pair(t, s, r)
	y, _ := pair(t, s, r)
	r.p.PauseReceives()
	ctx := ctxT(t, 5*time.Second)
	for i := range 2 {
		if err := y.Send(ctx, []byte{byte(i)}); err != nil {
			t.Fatal(err)
		}
	}
	if err := x.Send(ctx, []byte("x")); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	waiting := x.frameWaitingLocked()
	s.mu.Unlock()
	if !waiting {
		t.Fatal("x's message does not wait at the INI; the test needs it to")
	}
	return s, x
}
