//go:build linux && cgo

package integration

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/goxrc/goxrc/cm"
	"github.com/goxrc/goxrc/internal/objtrace"
	"github.com/goxrc/goxrc/rdmacm"
	"github.com/goxrc/goxrc/test/softroce"
	"github.com/goxrc/goxrc/verbs"
)

// kernelBaseline is the device's `rdma resource` counts before any test ran.
var kernelBaseline map[string]uint64

func TestMain(m *testing.M) {
	// Leak reports say where each leaked verbs object and CM id was made.
	objtrace.Enable()
	if dev := os.Getenv(softroce.EnvDev); dev != "" {
		res, err := softroce.Resources(dev)
		if err != nil {
			fmt.Fprintln(os.Stderr, "integration: baseline resources:", err)
			os.Exit(1)
		}
		kernelBaseline = res
	}
	os.Exit(m.Run())
}

// objects is what a test may leave behind: the device's `rdma resource`
// counts, the bindings' object counters and cm's process counters.
type objects struct {
	kernel map[string]uint64
	rdmacm rdmacm.Counters
	verbs  verbs.ObjectCounts
	cm     cm.ProcessStats
}

func objectsNow(t *testing.T, dev string) objects {
	t.Helper()
	res, err := softroce.Resources(dev)
	if err != nil {
		t.Fatal(err)
	}
	return objects{kernel: res, rdmacm: rdmacm.Counts(), verbs: verbs.Counts(), cm: cm.GlobalStats()}
}

// diff says how o differs from base, "" where it does not.
func (o objects) diff(base objects) string {
	var s string
	for _, k := range []string{"pd", "cq", "qp", "mr", "srq", "cm_id"} {
		if o.kernel[k] != base.kernel[k] {
			s += fmt.Sprintf(" %s %d (at start %d)", k, o.kernel[k], base.kernel[k])
		}
	}
	if o.verbs != base.verbs {
		s += fmt.Sprintf(" verbs objects %+v (at start %+v)", o.verbs, base.verbs)
	}
	if o.rdmacm != base.rdmacm {
		s += fmt.Sprintf(" rdmacm objects %+v (at start %+v)", o.rdmacm, base.rdmacm)
	}
	if c, b := o.cm, base.cm; c.ConnectionsOpen != b.ConnectionsOpen || c.QueuePairs != b.QueuePairs ||
		c.Listeners != b.Listeners || c.XRCQueuePairs != b.XRCQueuePairs || c.XRCKernelHandles != b.XRCKernelHandles {
		s += fmt.Sprintf(" cm %+v (at start %+v)", c, b)
	}
	return s
}

// waitObjects waits up to d for the objects to be back to base (connections
// closing in the background finish time-wait), and fails the test with what
// is left otherwise.
func waitObjects(t *testing.T, dev string, base objects, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		now := objectsNow(t, dev)
		left := now.diff(base)
		if left == "" {
			t.Logf("kernel resources back to the start: %v", now.kernel)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("leaked:%s\n%s", left, objtrace.Report())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestZZNothingLeaked runs last (this file sorts last): after every test of
// the binary, every QP, CQ, MR, PD, SRQ and CM id is gone, in the library's
// counters and in the kernel's.
func TestZZNothingLeaked(t *testing.T) {
	dev, _ := softroce.Device(t)
	waitObjects(t, dev, objects{kernel: kernelBaseline}, 15*time.Second)
}
