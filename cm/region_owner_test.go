package cm

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A peer's access that a region refuses (not granted, or the region
// revoked) is an RC responder's class C error: the device moves the
// region owner's queue pair to the error state as well (rxe_resp.c:
// RESPST_ERR_RKEY_VIOLATION, goto_error, rxe_qp_error), so the owner's
// connection breaks too, not only the peer's. The fake failed the peer's
// side alone, and the docs said as much.
func TestRefusedRemoteAccessBreaksOwnersConnection(t *testing.T) {
	ctx := ctxT(t)
	for name, refuse := range map[string]func(owned *Region){
		"not granted": func(*Region) {},
		"revoked":     func(owned *Region) { require.NoError(t, owned.Close()) },
	} {
		a, b, _ := fakePair(t, fakeOpts{})
		owned, err := b.RegisterMemory(64, RemoteRead)
		require.NoError(t, err)
		local, err := a.RegisterMemory(64, 0)
		require.NoError(t, err)
		desc := owned.Descriptor()
		refuse(owned)
		require.ErrorIs(t, a.WriteRemote(ctx, local, 0, 8, desc, 0), ErrPeerGone, name)
		_, err = b.Recv(ctx, make([]byte, 64))
		require.ErrorIs(t, err, ErrPeerGone, "%s: the owner's connection", name)
		require.NoError(t, owned.Close())
		require.NoError(t, local.Close())
	}
}
