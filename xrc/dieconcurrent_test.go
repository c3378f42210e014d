package xrc

import (
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// slowUnlisten holds the first destroy of a listener until open closes
// (a kernel whose rdma_destroy_id takes its time), and counts the
// listeners' destroys that have returned.
type slowUnlisten struct {
	wrapper
	mu        sync.Mutex
	listeners map[kernel.ID]bool
	held      bool
	holding   chan struct{} // closed once the first destroy waits
	open      chan struct{}
	destroyed int
}

func (s *slowUnlisten) Listen(a netip.AddrPort, ex kernel.Exchange) (kernel.ID, error) {
	id, err := s.Kernel.Listen(a, ex)
	if err == nil {
		s.mu.Lock()
		s.listeners[id] = true
		s.mu.Unlock()
	}
	return id, err
}

func (s *slowUnlisten) DestroyID(id kernel.ID) error {
	s.mu.Lock()
	l := s.listeners[id]
	hold := l && !s.held
	if hold {
		s.held = true
	}
	s.mu.Unlock()
	if hold {
		close(s.holding)
		<-s.open
	}
	err := s.Kernel.DestroyID(id)
	if l && err == nil {
		s.mu.Lock()
		s.destroyed++
		s.mu.Unlock()
	}
	return err
}

func (s *slowUnlisten) listenersDestroyed() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.destroyed
}

// Err promises that once it is not nil the endpoint listens no more. Two
// failures at once (the CM event channel breaks, then the receive poll
// fails) each call die: the first took the listeners off the endpoint and
// was destroying them, the second's unlisten found nothing to take and
// returned at once, and its die set the endpoint's failure. Err said the
// endpoint failed while its listeners were still in the kernel.
func TestConcurrentDieErrAfterListenersGone(t *testing.T) {
	w := newWorld(t)
	var su *slowUnlisten
	var rb *recvBroken
	var eb *eventsBroken
	b := w.wrappedEndpoint("10.0.69.1", 7000, func(k kernel.Kernel) kernel.Kernel {
		su = &slowUnlisten{wrapper: wrapper{k}, listeners: map[kernel.ID]bool{},
			holding: make(chan struct{}), open: make(chan struct{})}
		rb = &recvBroken{wrapper: wrapper{su}}
		rb.broken, rb.brk = context.WithCancel(context.Background())
		eb = newEventsBroken(rb)
		return eb
	})
	eb.brk() // a listen loop's die: unlisten, its first destroy held
	select {
	case <-su.holding:
	case <-time.After(5 * time.Second):
		t.Fatal("no listener destroyed after the CM channel broke")
	}
	rb.brk() // the receive loop's die, meanwhile
	var once sync.Once
	openGate := func() { once.Do(func() { close(su.open) }) }
	defer openGate() // before the Cleanup's Close, which waits for the die
	time.AfterFunc(500*time.Millisecond, openGate)
	deadline := time.Now().Add(5 * time.Second)
	for b.Err() == nil {
		if time.Now().After(deadline) {
			t.Fatal("the endpoint did not fail")
		}
		time.Sleep(time.Millisecond)
	}
	if n := su.listenersDestroyed(); n != 2 {
		t.Fatalf("Err() = %v with %d of the 2 listeners destroyed: the endpoint still listens", b.Err(), n)
	}
}
