package cm

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A one-sided request to a peer whose QP is in the error state gets no
// answer there: the device retries it until our QP is flushed (our CM hears
// of the peer's disconnect) or its retries run out, as the fake has it for
// sends and probes, and the peer's memory is not touched. The fake's post
// completed it at once against the peer's region: a write to (or read from)
// a peer that had shut its QP (its Close under way, a refused access that
// broke it) succeeded, which no device does.
func TestFakeOneSidedToShutPeerIsRetried(t *testing.T) {
	ctx := ctxT(t)
	for _, write := range []bool{true, false} {
		a, b, w := fakePair(t, fakeOpts{})
		exposed, err := b.RegisterMemory(64, RemoteRead|RemoteWrite)
		require.NoError(t, err)
		copy(exposed.Bytes(), "original")
		local, err := a.RegisterMemory(64, 0)
		require.NoError(t, err)
		copy(local.Bytes(), "incoming")
		w.ends[1].shutdown() // b's QP in the error state; a's CM has heard nothing
		op := a.ReadRemote
		if write {
			op = a.WriteRemote
		}
		err = op(ctx, local, 0, 8, exposed.Descriptor(), 0)
		require.ErrorIs(t, err, ErrPeerGone, "write %v", write)
		require.ErrorIs(t, err, errFakeRetries, "write %v: not the retries running out", write)
		require.Equal(t, "original", string(exposed.Bytes()[:8]), "write %v: the shut peer's region was written", write)
		require.Equal(t, "incoming", string(local.Bytes()[:8]), "write %v: the shut peer's region was read", write)
		require.NoError(t, local.Close())
		require.NoError(t, exposed.Close())
	}
}
