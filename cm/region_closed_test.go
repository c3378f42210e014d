package cm

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A closed Region gives no memory and no descriptor, as its Bytes and
// Descriptor say ("as a closed one"): on a device, verbs.MR's accessors
// give nothing once Close deregistered it and unmapped its memory, and the
// fake transport's memory does the same.
func TestRegionClosedGivesNothing(t *testing.T) {
	a, _, _ := fakePair(t, fakeOpts{})
	r, err := a.RegisterMemory(64, RemoteRead|RemoteWrite)
	require.NoError(t, err)
	require.Len(t, r.Bytes(), 64)
	require.NotZero(t, r.Descriptor())
	require.NoError(t, r.Close())
	require.Nil(t, r.Bytes(), "Bytes after Close")
	require.Zero(t, r.Descriptor(), "Descriptor after Close")
	require.Equal(t, r.Descriptor(), (*Region)(nil).Descriptor(), "as a nil Region's")
}
