//go:build linux && cgo

package integration

import (
	"errors"
	"io"
	"net/netip"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/cm"
)

// removalEndsChildEnv makes TestCMDeviceRemovalAfterEnds run its checks.
const removalEndsChildEnv = "GOXRC_REMOVAL_ENDS_CHILD"

// TestCMDeviceRemovalAfterEnds removes the device under connections that
// had ended before: one whose peer sent its last message and closed (read
// to io.EOF), one that we half-closed (CloseWrite). cm lets go of both on
// its own, as of every connection on a removed device: the first, whose
// CM id had left time-wait after the peer's disconnect, heard of nothing
// (its watcher had ended at TIMEWAIT_EXIT, and rxe sends no DEVICE_FATAL,
// only the CM's DEVICE_REMOVAL), and held its QP and the device until the
// application's Close. Neither release is the application's Close: the
// first still reads io.EOF and its Send says the peer is gone, not
// ErrClosed; the second's Send says ErrClosed, as CloseWrite's doc has it,
// and CloseWrite again nil.
func TestCMDeviceRemovalAfterEnds(t *testing.T) {
	removalTest(t, removalEndsChildEnv, removalEndsChild)
}

func removalEndsChild(t *testing.T) {
	ip := removalVeth.Addr.Addr()
	ctx := cmCtx(t, 90*time.Second)
	base := baseline(t, "")
	l, err := cm.Listen(ctx, netip.AddrPortFrom(ip, 0).String(), cm.WithMessageSize(256), cm.WithQueueDepth(4))
	require.NoError(t, err)
	buf := make([]byte, 256)

	ended, endedPeer := connectAndSend(t, ctx, l, l.Addr().String(), "hello")
	require.NoError(t, endedPeer.Send(ctx, []byte("last")))
	require.NoError(t, endedPeer.Close())
	k, err := ended.Recv(ctx, buf)
	require.NoError(t, err)
	require.Equal(t, "last", string(buf[:k]))
	_, err = ended.Recv(ctx, buf)
	require.ErrorIs(t, err, io.EOF)

	half, halfPeer := connectAndSend(t, ctx, l, l.Addr().String(), "hello")
	require.NoError(t, half.CloseWrite())
	_, err = halfPeer.Recv(ctx, buf)
	require.ErrorIs(t, err, io.EOF, "the peer reads our end of stream")

	require.NoError(t, exec.Command("rdma", "link", "delete", removalDev).Start())
	// cm lets go of the device once every connection on it has taken in
	// the removal and released itself.
	require.Eventually(t, func() bool { return cm.GlobalStats().Devices == base.cm.Devices }, 30*time.Second, 20*time.Millisecond,
		"the removed device is still open")

	_, err = ended.Recv(ctx, buf)
	require.ErrorIs(t, err, io.EOF, "Recv after the peer's end and the removal")
	err = ended.Send(ctx, []byte("x"))
	require.False(t, errors.Is(err, cm.ErrClosed), "Send after the peer's end and the removal: %v; the application closed nothing", err)
	require.ErrorIs(t, err, cm.ErrPeerGone)
	require.ErrorIs(t, half.Send(ctx, []byte("x")), cm.ErrClosed, "Send after CloseWrite and the removal")
	require.NoError(t, half.CloseWrite(), "CloseWrite again, before Close")

	for _, c := range []*cm.Conn{ended, half, halfPeer} {
		require.NoError(t, c.Close())
	}
	require.ErrorIs(t, ended.Send(ctx, []byte("x")), cm.ErrClosed, "after the application's Close")
	require.NoError(t, l.Close())
	waitObjects(t, base, 10*time.Second)
}
