package xrc

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/goxrc/goxrc/internal/kernel"
)

// stallAfter holds the process's receive polls back, from the first poll
// after one that took a message containing marker, until hold closes.
type stallAfter struct {
	kernel.Kernel
	mu     sync.Mutex
	marker []byte
	hold   chan struct{}
	held   bool
}

func (g *stallAfter) PollRecv(ctx context.Context, s kernel.SRQ, out []kernel.RecvCompletion) (int, error) {
	g.mu.Lock()
	h := g.hold
	held := g.held
	g.mu.Unlock()
	if held {
		select {
		case <-h:
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	n, err := g.Kernel.PollRecv(ctx, s, out)
	g.mu.Lock()
	for _, rc := range out[:n] {
		if g.marker != nil && bytes.Contains(rc.Payload, g.marker) {
			g.held, g.marker = true, nil
		}
	}
	g.mu.Unlock()
	return n, err
}

func (g *stallAfter) set(marker []byte, hold chan struct{}) {
	g.mu.Lock()
	g.marker, g.hold, g.held = marker, hold, false
	g.mu.Unlock()
}

// onDestroyID closes its channel once the endpoint has destroyed the CM id
// it was armed with.
type onDestroyID struct {
	kernel.Kernel
	mu    sync.Mutex
	id    kernel.ID
	armed chan struct{}
}

func (k *onDestroyID) DestroyID(id kernel.ID) error {
	err := k.Kernel.DestroyID(id)
	k.mu.Lock()
	if k.armed != nil && id == k.id {
		close(k.armed)
		k.armed = nil
	}
	k.mu.Unlock()
	return err
}

func (k *onDestroyID) arm(id kernel.ID, c chan struct{}) {
	k.mu.Lock()
	k.id, k.armed = id, c
	k.mu.Unlock()
}

// An endpoint closing after its connections' graceful close keeps its SRQ
// until their peers' FINs, which answer its own, have come: destroyed
// under them, each such FIN failed the peer's INI, and the peer's uplink,
// healthy, recovered, moving every other leg on it. Through cm a closed
// listener's endpoint, or a dialer endpoint, closes so with its last
// connection (about 1 close in 10 recovered so on the fabric). Here the
// peer reads its SRQ, and so answers, only once the closing endpoint's
// listeners are gone.
func TestEndpointCloseWaitsForAnsweringFINs(t *testing.T) {
	w := newWorld(t)
	stall := &stallAfter{}
	a := w.wrappedEndpoint("10.0.0.1", 7000, func(k kernel.Kernel) kernel.Kernel {
		stall.Kernel = k
		return stall
	})
	for round := range 30 {
		bk := &onDestroyID{}
		b := w.wrappedEndpoint("10.0.0.2", 7001+round, func(k kernel.Kernel) kernel.Kernel {
			bk.Kernel = k
			return bk
		})
		ca, cb := pair(t, a, b)
		held := make(chan struct{})
		marker := fmt.Appendf(nil, "last message of round %d", round)
		stall.set(marker, held) // a reads nothing after it until b's listeners go
		roundTrip(t, cb, ca, marker)
		if err := cb.Close(); err != nil {
			t.Fatal(err)
		}
		b.mu.Lock()
		bk.arm(b.lu, held) // b's SIDR listener, the last to go at Close
		b.mu.Unlock()
		if err := b.Close(); err != nil {
			t.Fatal(err)
		}
		eventually(t, "a's connection ended", func() (bool, string) {
			s := a.Stats()
			return s.Conns == 0, fmt.Sprintf("%+v", s)
		})
		if r := a.Stats().Recoveries; r != 0 {
			t.Fatalf("round %d: a's uplink recovered %d times after a graceful close, want 0", round, r)
		}
		ca.Close()
	}
}
