package cm

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A descriptor that claims more than the peer registered (a Len or an Addr
// forged, or a stale one) passes this side's checks, which only have the
// descriptor's word; the peer's device refuses the access, as
// RegisterMemory's doc says of any access its region does not allow: the
// operation fails, nothing outside the region is touched, and the
// connection breaks.
func TestOneSidedForgedDescriptorRange(t *testing.T) {
	ctx := ctxT(t)
	for _, tc := range []struct {
		name  string
		forge func(RemoteRegion) RemoteRegion
		roff  uint64
	}{
		{"Len past the region", func(r RemoteRegion) RemoteRegion { r.Len = 4096; return r }, 1000},
		{"Addr before the region", func(r RemoteRegion) RemoteRegion { r.Addr -= 8; r.Len += 8; return r }, 0},
	} {
		for _, write := range []bool{true, false} {
			a, b, _ := fakePair(t, fakeOpts{})
			exposed, err := b.RegisterMemory(64, RemoteRead|RemoteWrite)
			require.NoError(t, err)
			copy(exposed.Bytes(), "original")
			local, err := a.RegisterMemory(64, 0)
			require.NoError(t, err)
			copy(local.Bytes(), "incoming")
			op := a.ReadRemote
			if write {
				op = a.WriteRemote
			}
			err = op(ctx, local, 0, 8, tc.forge(exposed.Descriptor()), tc.roff)
			require.ErrorIs(t, err, ErrPeerGone, "%s, write %v", tc.name, write)
			require.Equal(t, "original", string(exposed.Bytes()[:8]), tc.name)
			require.Equal(t, "incoming", string(local.Bytes()[:8]), tc.name)
			require.ErrorIs(t, a.Send(ctx, []byte("after")), ErrPeerGone, tc.name)
			require.NoError(t, local.Close())
			require.NoError(t, exposed.Close())
		}
	}
}

// After the peer's Region.Close returns, its descriptor reaches nothing:
// the access fails at the peer's device, as RegisterMemory's doc says ("as
// a revoked region's does"), breaking this side's connection, and the
// closed region's memory is not written.
func TestOneSidedRevokedRegionBreaksConnection(t *testing.T) {
	ctx := ctxT(t)
	for _, write := range []bool{true, false} {
		a, b, _ := fakePair(t, fakeOpts{})
		local, remote := rdmaRegions(t, a, b)
		revoked, err := b.RegisterMemory(64, RemoteRead|RemoteWrite)
		require.NoError(t, err)
		kept := revoked.mem.(*fakeMem).b // the fake's memory outlives Close
		copy(kept, "original")
		desc := revoked.Descriptor()
		require.NoError(t, revoked.Close())
		copy(local.Bytes(), "incoming")
		op := a.ReadRemote
		if write {
			op = a.WriteRemote
		}
		require.ErrorIs(t, op(ctx, local, 0, 8, desc, 0), ErrPeerGone, "write %v", write)
		require.Equal(t, "original", string(kept[:8]), "the revoked region was written")
		require.Equal(t, "incoming", string(local.Bytes()[:8]), "the revoked region was read")
		require.ErrorIs(t, a.WriteRemote(ctx, local, 0, 8, remote, 0), ErrPeerGone, "the connection is broken")
	}
}
