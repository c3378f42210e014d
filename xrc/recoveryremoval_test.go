package xrc

import (
	"context"
	"errors"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// moveRemoval makes the RDMA CM report the device's removal
// (kernel.ErrDeviceRemoved, as kcm's Event does for DEVICE_REMOVAL) on the
// CM ids of a recovery's MOVE exchanges (those of ex made once armed) once
// first is closed, and on every other id once all is closed: the CM sends
// the event to every id on the device, and a recovery waiting for a MOVE's
// answer may read it before the listeners do.
type moveRemoval struct {
	kernel.Kernel
	ex      kernel.Exchange
	mu      sync.Mutex
	armed   bool
	moving  map[kernel.ID]bool
	waiting chan struct{} // closed when a MOVE's id is waited on
	first   chan struct{}
	all     chan struct{}
}

func newMoveRemoval(ex kernel.Exchange) *moveRemoval {
	return &moveRemoval{ex: ex, moving: map[kernel.ID]bool{}, waiting: make(chan struct{}),
		first: make(chan struct{}), all: make(chan struct{})}
}

func (r *moveRemoval) Connect(ctx context.Context, dst netip.AddrPort, ex kernel.Exchange, qpNum uint32, privateData []byte) (kernel.ID, error) {
	id, err := r.Kernel.Connect(ctx, dst, ex, qpNum, privateData)
	if err == nil {
		r.mu.Lock()
		if r.armed && ex == r.ex {
			r.moving[id] = true
		}
		r.mu.Unlock()
	}
	return id, err
}

func (r *moveRemoval) Event(ctx context.Context, id kernel.ID) (kernel.Event, error) {
	r.mu.Lock()
	removed := r.all
	if r.moving[id] {
		removed = r.first
		select {
		case <-r.waiting:
		default:
			close(r.waiting)
		}
	}
	r.mu.Unlock()
	return eventOrRemoval(ctx, r.Kernel, id, removed)
}

// A device removal read first by a recovery's MOVE exchange, while it waits
// for the receiver's answer (PHYS_REQ: the new INI's exchange; VIRT_REQ: a
// leg's SIDR exchange), is the endpoint's end as where its listener reads
// it: the moving leg fails with ErrDeviceRemoved, and so does the endpoint.
// moveDone took it for the receiver's refusal, "ErrPeerGone: leg not moved:
// %v", which dropped ErrDeviceRemoved from the chain, and the listeners'
// removal a moment later kept that verdict (failLocked keeps the first):
// the application read that its peer was gone, on a device that was.
func TestDeviceRemovalDuringRecoveryMove(t *testing.T) {
	for _, tc := range []struct {
		name string
		ex   kernel.Exchange
	}{{"PHYS_REQ", kernel.ExchangeXRC}, {"VIRT_REQ", kernel.ExchangeSIDR}} {
		t.Run(tc.name, func(t *testing.T) { testDeviceRemovalDuringRecoveryMove(t, tc.ex) })
	}
}

func testDeviceRemovalDuringRecoveryMove(t *testing.T, ex kernel.Exchange) {
	w := newWorld(t)
	rm := newMoveRemoval(ex)
	hs := func(c *Config) { longTimers(c); c.HandshakeTimeout = 30 * time.Second }
	s := w.wrappedEndpoint("10.0.84.1", 7000, func(k kernel.Kernel) kernel.Kernel { rm.Kernel = k; return rm }, hs)
	countedTags(s.Endpoint) // the legs move in the order they were paired
	g := &stallMoves{release: make(chan struct{})}
	defer close(g.release)
	// r1's MOVE waits (PHYS_REQ: its leg sorts first; VIRT_REQ: r2's leg
	// moves by PHYS_REQ first, r1's by VIRT_REQ after).
	var s1, s3 *Conn
	var r1, r3 *proc
	if ex == kernel.ExchangeXRC {
		r1 = w.wrappedEndpoint("10.0.84.2", 7001, func(k kernel.Kernel) kernel.Kernel { g.Kernel = k; return g }, longTimers)
		r3 = w.endpoint("10.0.84.2", 7003, longTimers)
		s1, _ = pair(t, s, r1)
		s3, _ = pair(t, s, r3)
	} else {
		r2 := w.endpoint("10.0.84.2", 7002, longTimers)
		r1 = w.wrappedEndpoint("10.0.84.2", 7001, func(k kernel.Kernel) kernel.Kernel { g.Kernel = k; return g }, longTimers)
		r3 = w.endpoint("10.0.84.2", 7003, longTimers)
		pair(t, s, r2)
		s1, _ = pair(t, s, r1)
		s3, _ = pair(t, s, r3)
	}
	rm.mu.Lock()
	rm.armed = true
	rm.mu.Unlock()
	r3.p.Kill()
	if err := sendErr(t, s3); !errors.Is(err, ErrPeerGone) {
		t.Fatalf("to the dead r3: %v", err)
	}
	ctx := ctxT(t, 10*time.Second)
	select {
	case <-rm.waiting: // the recovery waits for r1's answer to its MOVE
	case <-ctx.Done():
		t.Fatal("the recovery never waited for r1's MOVE")
	}
	close(rm.first) // the MOVE's id reads DEVICE_REMOVAL first
	eventually(t, "the moving leg failed", func() (bool, string) {
		err := s1.Err()
		return err != nil, "Err nil"
	})
	if err := s1.Err(); !errors.Is(err, ErrDeviceRemoved) {
		t.Errorf("the leg moving when the device went: Err() = %v, want ErrDeviceRemoved", err)
	}
	close(rm.all) // then every other id
	endedByRemoval(t, ctx, s, s1)
}
