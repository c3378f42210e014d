//go:build linux && cgo

package integration

import (
	"context"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/cm"
	"github.com/goxrc/goxrc/internal/faults"
	"github.com/goxrc/goxrc/test/softroce"
)

// TestCMDialAfterChannelBroke: the event channel every Dial shares breaks
// (its reader fails) while a dialed connection still holds it. The dial
// under way fails, and the next Dial works on a new channel; it was refused
// until every connection on the broken one had closed. The listener runs in
// a process of its own: the fault fails the first read of any channel of
// this process, and a listener here could take it (its reader's last look
// after the held connection's ESTABLISHED), which refused the dial instead.
func TestCMDialAfterChannelBroke(t *testing.T) {
	_, ip := softroce.Device(t)
	_, addr := startVictim(t, "acceptor", netip.AddrPortFrom(ip, 0).String())
	// Only this process's objects: the acceptor's listener keeps the QPs of
	// its closed connections for the next (ProcessStats.CachedQueuePairs).
	base := baseline(t, "")
	ctx := cmCtx(t, 60*time.Second)
	held, err := cm.Dial(ctx, addr)
	require.NoError(t, err)
	t.Cleanup(func() { held.Close() }) // a failure must not leave it to the leak checks of later tests

	unset := faults.Set(faults.FailOnce("rdma_get_cm_event", syscall.EIO))
	err = failureOf(cm.Dial(ctx, addr))
	unset()
	require.ErrorIs(t, err, syscall.EIO, "the dial whose events could not be read")

	c, err := cm.Dial(ctx, addr)
	require.NoError(t, err, "a dial after the shared channel broke")
	t.Cleanup(func() { c.Close() })
	require.NoError(t, c.Send(ctx, []byte("after")))
	buf := make([]byte, 16)
	n, err := c.Recv(ctx, buf)
	require.NoError(t, err)
	require.Equal(t, "after", string(buf[:n]), "the acceptor's echo")

	held.Close()
	c.Close()
	waitObjects(t, base, 15*time.Second)
}

// TestCMCloseAfterRefusedDisconnect: a Close whose rdma_disconnect the CM
// refuses sends no DREQ, so no time-wait starts until the peer disconnects
// on its own. Against a peer that holds the connection open, Close waited
// for a TIMEWAIT_EXIT until its timeout (the handshake timeout) and
// returned that. It now releases at once, as from a vanished peer
// (destroying the id has the kernel's CM disconnect), says why, and leaves
// nothing behind.
func TestCMCloseAfterRefusedDisconnect(t *testing.T) {
	_, ip := softroce.Device(t)
	_, addr := startVictim(t, "holder", netip.AddrPortFrom(ip, 0).String())
	base := baseline(t, "")
	ctx := cmCtx(t, 60*time.Second)
	c, err := cm.Dial(ctx, addr, cm.WithHandshakeTimeout(20*time.Second))
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	require.NoError(t, c.Send(ctx, []byte("held")))

	unset := faults.Set(faults.FailOnce("rdma_disconnect", syscall.EINVAL))
	err = c.Close()
	unset()
	require.ErrorIs(t, err, syscall.EINVAL, "Close says its disconnect was refused")
	require.ErrorContains(t, err, "rdma_disconnect")
	require.NotErrorIs(t, err, context.DeadlineExceeded, "Close waited for a time-wait that no DREQ of ours started")
	waitObjects(t, base, 15*time.Second)
}
