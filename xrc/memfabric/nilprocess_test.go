package memfabric_test

import (
	"testing"

	"github.com/goxrc/goxrc/xrc/memfabric"
)

// TestNilProcessIsZero: a nil Process is the zero one, a process of no
// node that holds nothing, as a nil object of cm, rdmacm, verbs or xrc is
// a closed one: Kill (its Close), PauseReceives and ResumeReceives do
// nothing, Handles is 0 and Node nil. A test's cleanup that kills a
// process its setup never made (defer p.Kill() before an early return)
// must not panic.
func TestNilProcessIsZero(t *testing.T) {
	for _, p := range []*memfabric.Process{nil, {}} {
		calls := []struct {
			name string
			f    func()
		}{
			{"Kill", p.Kill},
			{"Kill again", p.Kill},
			{"PauseReceives", p.PauseReceives},
			{"ResumeReceives", p.ResumeReceives},
			{"Handles", func() {
				if h := p.Handles(); h != 0 {
					t.Errorf("%#v: Handles %d, want 0", p, h)
				}
			}},
			{"Node", func() {
				if n := p.Node(); n != nil {
					t.Errorf("%#v: Node %v, want nil", p, n)
				}
			}},
		}
		for _, c := range calls {
			func() {
				defer func() {
					if r := recover(); r != nil {
						t.Errorf("(%#v).%s panicked: %v", p, c.name, r)
					}
				}()
				c.f()
			}()
		}
	}
}

// TestKillTwiceAndAfterPowerOff: Kill of a dead process does nothing, as
// its doc says, whether Kill or the node's PowerOff ended it, and calls
// that race with it neither panic nor deadlock.
func TestKillTwiceAndAfterPowerOff(t *testing.T) {
	f := memfabric.New()
	n := f.Node("10.4.0.1")
	p, q := n.Process(), n.Process()
	p.Kill()
	p.Kill()
	p.PauseReceives()
	p.ResumeReceives()
	done := make(chan struct{})
	for range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			q.Kill()
			n.PowerOff()
			n.FailDevice()
			q.PauseReceives()
			q.ResumeReceives()
		}()
	}
	for range 4 {
		<-done
	}
	q.Kill()
	if p.Handles() != 0 || q.Handles() != 0 || n.Stats() != (memfabric.NodeStats{}) {
		t.Fatalf("handles %d %d, %+v", p.Handles(), q.Handles(), n.Stats())
	}
}
