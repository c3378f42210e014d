package memfabric

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// TestStatsIsOneSnapshot: Stats is one state of the node, however its
// objects come and go meanwhile: every live TGT has a handle and holds its
// domain, so a count with a TGT and no handle, or no domain, never was.
func TestStatsIsOneSnapshot(t *testing.T) {
	n := New().Node("10.1.0.1")
	p := n.Process()
	defer p.Kill()
	k, _ := kernel.Unwrap(p)
	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		for !stop.Load() {
			d, err := k.OpenXRCD("", 0)
			if err != nil {
				t.Error(err)
				return
			}
			q, _, err := k.CreateTGT(d)
			if err != nil {
				t.Error(err)
				return
			}
			k.DestroyQP(q)
			k.CloseXRCD(d)
		}
	}()
	defer func() { stop.Store(true); <-done }()
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); {
		s := n.Stats()
		if s.TGTHandles < s.TGTs || (s.TGTs > 0 && s.XRCDs == 0) {
			t.Fatalf("a state that never was: %+v", s)
		}
	}
}
