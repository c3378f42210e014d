//go:build linux && cgo

package integration

import (
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
// under way fails, the held connection fails and closes, and the next
// Dial works on a new channel; it was refused until every connection on
// the broken one had closed.
func TestCMDialAfterChannelBroke(t *testing.T) {
	dev, _ := softroce.Device(t)
	base := baseline(t, dev)
	l, addr := cmListen(t)
	ctx := cmCtx(t, 60*time.Second)
	held, err := cm.Dial(ctx, addr)
	require.NoError(t, err)
	heldPeer, err := l.Accept(ctx)
	require.NoError(t, err)

	unset := faults.Set(faults.FailOnce("rdma_get_cm_event", syscall.EIO))
	_, err = cm.Dial(ctx, addr)
	unset()
	require.ErrorIs(t, err, syscall.EIO, "the dial whose events could not be read")

	c, err := cm.Dial(ctx, addr)
	require.NoError(t, err, "a dial after the shared channel broke")
	s, err := l.Accept(ctx)
	require.NoError(t, err)
	require.NoError(t, c.Send(ctx, []byte("after")))
	buf := make([]byte, 16)
	n, err := s.Recv(ctx, buf)
	require.NoError(t, err)
	require.Equal(t, "after", string(buf[:n]))

	for _, x := range []*cm.Conn{held, heldPeer, c, s} {
		x.Close()
	}
	require.NoError(t, l.Close())
	waitObjects(t, base, 15*time.Second)
}
