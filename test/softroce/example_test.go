package softroce_test

import (
	"fmt"
	"testing"

	"github.com/goxrc/goxrc/test/softroce"
)

func ExampleDevice() {
	// In a test function: skips on hosts without RDMA, fails if RXE_DEV names a missing device.
	test := func(t *testing.T) {
		dev, addr := softroce.Device(t)
		t.Logf("using %s at %s", dev, addr)
	}
	_ = test
	fmt.Println(softroce.DefaultVeth.Name, softroce.DefaultVeth.Addr)
	// Output: veth0 10.77.0.1/24
}

// Setup needs root, rdma_rxe and veth (the test VM), so the example is
// compiled, not run.
func ExampleSetup() {
	// As root in the test VM, with rdma_rxe and veth loaded:
	l, err := softroce.Setup("rxe0", softroce.DefaultVeth)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(l.Name, l.Netdev)
}
