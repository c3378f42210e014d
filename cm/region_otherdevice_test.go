package cm

import (
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/verbs"
)

// A Region of another device is refused as an argument, before anything is
// posted, and the connection stays up (the device never saw the request).
// The post's refusal was taken for a broken queue pair: ErrPeerGone, and
// the connection failed.
func TestOneSidedOtherDeviceRegionKeepsConnection(t *testing.T) {
	a, b, w := fakePair(t, fakeOpts{})
	other, _, _ := fakePair(t, fakeOpts{})
	ctx := ctxT(t)
	foreign, err := other.RegisterMemory(64, 0)
	require.NoError(t, err)
	defer foreign.Close()
	local, remote := rdmaRegions(t, a, b)
	for name, op := range map[string]func() error{
		"WriteRemote": func() error { return a.WriteRemote(ctx, foreign, 0, 8, remote, 0) },
		"ReadRemote":  func() error { return a.ReadRemote(ctx, foreign, 0, 8, remote, 0) },
	} {
		err := op()
		require.ErrorIs(t, err, ErrInvalid, name)
		require.NotErrorIs(t, err, ErrPeerGone, name)
	}
	w.mu.Lock()
	out := w.ends[0].rdmaOut
	w.mu.Unlock()
	require.Zero(t, out, "a refused request was posted")
	copy(local.Bytes(), "still up")
	require.NoError(t, a.WriteRemote(ctx, local, 0, 8, remote, 0), "the refusal broke the connection")
	require.NoError(t, a.Send(ctx, []byte("alive")))
	buf := make([]byte, 16)
	n, err := b.Recv(ctx, buf)
	require.NoError(t, err)
	require.Equal(t, "alive", string(buf[:n]))
}

// postEINVAL is a fake end whose device refuses one-sided posts with EINVAL,
// as a provider does for a queue pair it will not post on.
type postEINVAL struct{ *fakeEnd }

func (postEINVAL) postRDMA(bool, *Region, int, int, RemoteRegion, uint64) error {
	return &verbs.OpError{Op: "ibv_post_send", Err: &verbs.PostError{Err: syscall.EINVAL}}
}

// Only a refusal before the post leaves the connection up: a device's EINVAL
// from the post itself matches ErrInvalid too (verbs.OpError.Is), and is
// still a broken queue pair, which fails the connection.
func TestOneSidedPostEINVALStillFailsConnection(t *testing.T) {
	a, b, w := fakePair(t, fakeOpts{})
	a.t = postEINVAL{w.ends[0]}
	local, remote := rdmaRegions(t, a, b)
	err := a.WriteRemote(ctxT(t), local, 0, 8, remote, 0)
	require.ErrorIs(t, err, ErrInvalid, "the device's EINVAL")
	require.ErrorIs(t, err, ErrPeerGone)
	require.ErrorIs(t, a.Send(ctxT(t), []byte("after")), ErrPeerGone, "the connection failed")
}
