package cm

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// The fake's one-sided post on an end whose QP is in the error state is
// flushed, as its sends are: it wrote into the peer's region (or, with a
// key the peer refuses, broke the peer). Since a refused access shuts the
// region owner's end too, the owner's own one-sided post before its Conn
// heard of that reached the requester's memory, which no device does.
func TestFakeShutEndFlushesOneSided(t *testing.T) {
	a, b, w := fakePair(t, fakeOpts{})
	target, err := a.RegisterMemory(64, RemoteWrite)
	require.NoError(t, err)
	defer target.Close()
	local, err := b.RegisterMemory(64, 0)
	require.NoError(t, err)
	defer local.Close()
	copy(local.Bytes(), "late")

	w.ends[1].shutdown() // b's QP in the error state
	require.NoError(t, w.ends[1].postRDMA(true, local, 0, 4, target.Descriptor(), 0))
	require.Equal(t, make([]byte, 4), target.Bytes()[:4], "a shut end's RDMA write reached the peer's memory")
	// A read target does not grant: a device would have refused it, had
	// it been sent.
	require.NoError(t, w.ends[1].postRDMA(false, local, 0, 4, target.Descriptor(), 0))
	w.mu.Lock()
	defer w.mu.Unlock()
	require.False(t, w.ends[0].shut, "a shut end's RDMA broke the peer")
}
