//go:build linux && cgo

package integration

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/goxrc/goxrc/cm"
	"github.com/goxrc/goxrc/rdmacm"
	"github.com/goxrc/goxrc/test/softroce"
	"github.com/goxrc/goxrc/verbs"
)

// kernelBaseline is the device's `rdma resource` counts before any test ran.
var kernelBaseline map[string]uint64

func TestMain(m *testing.M) {
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

// TestZZNothingLeaked runs last (this file sorts last): after every test of
// the binary, every QP, CQ, MR, PD, SRQ and CM id is gone, in the library's
// counters and in the kernel's.
func TestZZNothingLeaked(t *testing.T) {
	dev, _ := softroce.Device(t)
	var last string
	deadline := time.Now().Add(15 * time.Second) // connections closing in the background finish time-wait
	for {
		res, err := softroce.Resources(dev)
		if err != nil {
			t.Fatal(err)
		}
		last = ""
		for _, k := range []string{"pd", "cq", "qp", "mr", "srq", "cm_id"} {
			if res[k] != kernelBaseline[k] {
				last += fmt.Sprintf(" %s %d (at start %d)", k, res[k], kernelBaseline[k])
			}
		}
		if !verbs.Counts().IsZero() {
			last += fmt.Sprintf(" verbs objects %+v", verbs.Counts())
		}
		if c := rdmacm.Counts(); c != (rdmacm.Counters{}) {
			last += fmt.Sprintf(" rdmacm objects %+v", c)
		}
		if s := cm.GlobalStats(); s.ConnectionsOpen != 0 || s.QueuePairs != 0 || s.Listeners != 0 {
			last += fmt.Sprintf(" cm %+v", s)
		}
		if last == "" {
			t.Logf("kernel resources back to the start: %v", res)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("leaked:%s", last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
