package cm

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// GlobalStats shows the XRC engine's uplinks, downlinks, local counts, QPs
// and kernel handles (issue 4: "Stats show uplinks, downlinks, kernel
// handles, local counts and QPs"). Only XRCUplinks and XRCKernelHandles
// were checked by a test (and XRCQueuePairs at zero), so a sum that left
// out downlinks or local counts passed. One connection between two
// processes: each side has one uplink and one downlink (the reciprocal
// leg's) counting one leg; all go back to where they were after Close.
func TestGlobalStatsXRCCounts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	before := GlobalStats()
	f := newFabric(t)
	c, s := fabricPair(ctx, t, f.Node("10.1.0.1").Process(), f.Node("10.1.0.2").Process(), nil, nil)
	got := GlobalStats()
	require.Equal(t, 2, got.XRCUplinks-before.XRCUplinks, "one INI each way")
	require.Equal(t, 2, got.XRCDownlinks-before.XRCDownlinks, "one TGT handle each way")
	require.Equal(t, 2, got.XRCLocalCounts-before.XRCLocalCounts, "one leg counted on each downlink")
	require.Equal(t, 4, got.XRCQueuePairs-before.XRCQueuePairs, "uplinks and downlinks")
	require.Positive(t, got.XRCKernelHandles-before.XRCKernelHandles)
	require.NoError(t, c.Close())
	require.NoError(t, s.Close())
	require.Eventually(t, func() bool {
		g := GlobalStats()
		return g.XRCUplinks == before.XRCUplinks && g.XRCDownlinks == before.XRCDownlinks &&
			g.XRCLocalCounts == before.XRCLocalCounts && g.XRCQueuePairs == before.XRCQueuePairs
	}, 5*time.Second, 5*time.Millisecond, "after Close: %+v, before %+v", GlobalStats(), before)
}
