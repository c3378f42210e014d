//go:build linux && cgo

package integration

import (
	"fmt"
	"maps"
	"net/netip"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/goxrc/goxrc/cm"
	"github.com/goxrc/goxrc/internal/objtrace"
	"github.com/goxrc/goxrc/rdmacm"
	"github.com/goxrc/goxrc/test/softroce"
	"github.com/goxrc/goxrc/verbs"
)

// kernelBaseline is this process's `rdma resource` counts on the device
// before any test ran. Its own only: other processes (the -race build of
// these tests, beside it on a second device in the VM) listen on wildcard
// addresses, whose ids the kernel makes on every device.
var kernelBaseline map[string]uint64

func TestMain(m *testing.M) {
	// Leak reports say where each leaked verbs object and CM id was made.
	objtrace.Enable()
	if dev := os.Getenv(softroce.EnvDev); dev != "" {
		res, err := softroce.ProcessResources(dev, os.Getpid())
		if err != nil {
			fmt.Fprintln(os.Stderr, "integration: baseline resources:", err)
			os.Exit(1)
		}
		kernelBaseline = res
	}
	os.Exit(m.Run())
}

// objects is what a test may leave behind: this process's `rdma resource`
// counts on the device (none for dev ""), the bindings' object counters, cm's process
// counters and the goroutines. Every test that makes connections compares
// them at its end with what it found at its start (baseline, waitObjects).
type objects struct {
	dev        string
	kernel     map[string]uint64
	rdmacm     rdmacm.Counters
	verbs      verbs.ObjectCounts
	cm         cm.ProcessStats
	goroutines int
}

// baseline is what this process and dev (none for "") hold now, the
// devices cm keeps open while idle closed first: they are no leak, and a
// test's own would otherwise outlive its check by their idle time.
func baseline(t *testing.T, dev string) objects {
	t.Helper()
	cm.CloseIdleDevices()
	o := objects{dev: dev, rdmacm: rdmacm.Counts(), verbs: verbs.Counts(), cm: cm.GlobalStats(), goroutines: runtime.NumGoroutine()}
	if dev != "" {
		res, err := softroce.ProcessResources(dev, os.Getpid())
		if err != nil {
			t.Fatal(err)
		}
		o.kernel = res
	}
	return o
}

// diff says how o differs from base, "" where it does not. The kernel's
// count of device contexts is left out: librdmacm keeps the context of
// every device it bound an id to for the life of the process
// (ucma_put_device releases only the PD); the contexts goxrc opens are in
// the verbs counters. Fewer goroutines than at base are no leak.
func (o objects) diff(base objects) string {
	var s string
	if base.kernel != nil {
		for _, k := range []string{"pd", "cq", "qp", "mr", "srq", "cm_id"} {
			if o.kernel[k] != base.kernel[k] {
				s += fmt.Sprintf(" %s %d (at start %d)", k, o.kernel[k], base.kernel[k])
			}
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
	if base.goroutines > 0 && o.goroutines > base.goroutines {
		s += fmt.Sprintf(" goroutines %d (at start %d)", o.goroutines, base.goroutines)
	}
	return s
}

// waitObjects waits up to d for the objects to be back to base (connections
// closing in the background finish time-wait), and fails the test with what
// is left, where each leaked object was made and every goroutine's stack
// otherwise.
func waitObjects(t *testing.T, base objects, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		now := baseline(t, base.dev)
		left := now.diff(base)
		if left == "" {
			if base.kernel != nil {
				t.Logf("kernel resources back to the start: %v", now.kernel)
			}
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("leaked after %v:%s\n%s\ngoroutines:\n%s", d, left, objtrace.Report(), buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestLeakChecksCountOwnObjects: the kernel counts the leak checks compare
// are this process's own. Another process's listener (a victim's) has its
// CM ids among that process's and not among ours; a listener of ours adds
// as many to ours.
func TestLeakChecksCountOwnObjects(t *testing.T) {
	dev, addr := softroce.Device(t)
	counts := func(pid int) map[string]uint64 {
		t.Helper()
		res, err := softroce.ProcessResources(dev, pid)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	base := baseline(t, dev)
	victim, _ := startVictim(t, "server", netip.AddrPortFrom(addr, 0).String())
	theirs := counts(victim.Process.Pid)["cm_id"]
	if theirs == 0 {
		t.Fatal("the victim's listener: no CM id of the victim's")
	}
	if got := counts(os.Getpid()); !maps.Equal(got, base.kernel) {
		t.Errorf("the victim's listener among ours: %v, at start %v", got, base.kernel)
	}
	cmListen(t)
	if got, was := counts(os.Getpid())["cm_id"], base.kernel["cm_id"]; got != was+theirs {
		t.Errorf("our listener: %d CM ids of ours, want %d", got, was+theirs)
	}
}

// TestZZNothingLeaked runs last (this file sorts last): after every test of
// the binary, every QP, CQ, MR, PD, SRQ and CM id is gone, in the library's
// counters and in the kernel's.
func TestZZNothingLeaked(t *testing.T) {
	dev, _ := softroce.Device(t)
	waitObjects(t, objects{dev: dev, kernel: kernelBaseline}, 15*time.Second)
}
