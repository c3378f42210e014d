//go:build linux && cgo

package rdmacm

import (
	"context"
	"errors"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/goxrc/goxrc/verbs"
)

// An id on no device (neither resolved nor bound to a device's address)
// refuses ResolveRoute, Connect and Accept with EINVAL: librdmacm reads
// the id's device in each of them without checking that there is one, and
// the process died there (SIGSEGV inside C; found by a review). Runs in the
// VM (test/run-tests.sh), where the kernel has the RDMA CM.
func TestIDWithoutDeviceRefuses(t *testing.T) {
	ch, err := NewEventChannel()
	if err != nil {
		t.Skipf("no RDMA CM in this kernel (%v): run through the VM harness", err)
	}
	defer ch.Close()
	for _, tc := range []struct {
		name string
		ps   PortSpace
		qpt  verbs.QPType
		bind bool // to the unspecified address, which names no device
	}{
		{"TCP", PortSpaceTCP, verbs.QPTypeRC, false},
		{"TCP bound to 0.0.0.0", PortSpaceTCP, verbs.QPTypeRC, true},
		{"IB", PortSpaceIB, verbs.QPTypeRC, false},
		{"UDP", PortSpaceUDP, verbs.QPTypeUD, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id, err := ch.CreateID(tc.ps, tc.qpt)
			if err != nil {
				t.Fatal(err)
			}
			defer id.Close()
			if tc.bind {
				if err := id.Bind(netip.MustParseAddrPort("0.0.0.0:0")); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			calls := map[string]func() error{
				"ResolveRoute":           func() error { return id.ResolveRoute(ctx) },
				"Connect":                func() error { return id.Connect(ConnParam{}) },
				"Connect, max resources": func() error { return id.Connect(ConnParam{InitiatorDepth: 255, ResponderResources: 255}) },
				"Accept":                 func() error { return id.Accept(ConnParam{QPNum: 1}) },
			}
			for name, call := range calls {
				var oe *verbs.OpError
				if err := call(); !errors.Is(err, syscall.EINVAL) || !errors.As(err, &oe) {
					t.Errorf("%s on an id with no device: %v, want an OpError with EINVAL", name, err)
				}
			}
		})
	}
}
