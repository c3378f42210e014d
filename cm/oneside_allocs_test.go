package cm

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// WriteRemote and ReadRemote allocate nothing per operation (the VM's
// TestCMOneSidedWriteRead checks a write on a device); here both, with a
// cancellable ctx as well, on every CI run.
func TestOneSidedZeroAllocs(t *testing.T) {
	a, b, _ := fakePair(t, fakeOpts{})
	local, remote := rdmaRegions(t, a, b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	allocs := testing.AllocsPerRun(1000, func() {
		if err := a.WriteRemote(ctx, local, 0, 64, remote, 0); err != nil {
			t.Fatal(err)
		}
		if err := a.ReadRemote(ctx, local, 64, 64, remote, 0); err != nil {
			t.Fatal(err)
		}
	})
	require.Zero(t, allocs, "one-sided operations allocate")
}
