package cm

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// A one-sided operation longer than the device's largest message (its
// port's max_msg_sz: 1 GiB on mlx5, where a Region may be 2 GiB) was
// posted, and the device failed it (local length error), which took the
// QP to the error state: the connection broke for one call's argument. It
// is refused before the post now, with ErrMessageTooLong, and the
// connection goes on. The 1 GiB case's local region is made by hand (the
// check comes before its memory is touched, so none is allocated); the
// small device's regions are real, and its limit itself goes through.
func TestOneSidedOverDeviceMaxMessageKeepsConn(t *testing.T) {
	for _, limit := range []int{1 << 30, 64} {
		a, b, w := fakePair(t, fakeOpts{maxMsg: limit})
		local, remote := rdmaRegions(t, a, b)
		over, overRemote := local, remote
		if limit > local.size {
			over = &Region{mem: &fakeMem{w: w}, size: limit + 1}
			overRemote.Len = uint32(limit + 1)
		}
		ctx := context.Background()
		for name, op := range map[string]func(context.Context, *Region, int, int, RemoteRegion, uint64) error{
			"WriteRemote": a.WriteRemote, "ReadRemote": a.ReadRemote,
		} {
			err := op(ctx, over, 0, limit+1, overRemote, 0)
			require.ErrorIs(t, err, ErrMessageTooLong, "%s of %d bytes, device limit %d", name, limit+1, limit)
			require.NotErrorIs(t, err, ErrPeerGone, "%s over the device's limit broke the connection", name)
		}

		n := min(limit, local.size)
		copy(local.Bytes(), "hello")
		require.NoError(t, a.WriteRemote(ctx, local, 0, n, remote, 0), "limit %d", limit)
		require.NoError(t, a.ReadRemote(ctx, local, 0, n, remote, 0), "limit %d", limit)
		require.NoError(t, a.Send(ctx, []byte("ping")))
		buf := make([]byte, 256)
		got, err := b.Recv(ctx, buf)
		require.NoError(t, err)
		require.Equal(t, "ping", string(buf[:got]))
		require.Zero(t, a.Stats().Errors, "limit %d", limit)
	}
}
