//go:build linux && cgo

package integration

import (
	"net/netip"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/rdmacm"
	"github.com/goxrc/goxrc/verbs"
)

// rdmacmCheckContext checks the verbs context of a bound id.
func rdmacmCheckContext(t *testing.T, id *rdmacm.ID, dev string) {
	t.Helper()
	c := id.Context()
	if c == nil {
		t.Errorf("Context() of an id bound to %s is nil", dev)
		return
	}
	if c.Name() != dev {
		t.Errorf("Context().Name() = %q, want %q", c.Name(), dev)
	}
	if err := c.Close(); err != nil {
		t.Errorf("closing the wrapper: %v", err)
	}
}

// TestVerbsSharedChannelAcrossWrappers: librdmacm's device context can be
// wrapped more than once (each ID.Context call wraps it anew). A CQ made
// through one wrapper on a shared channel made through another must still
// have its events delivered by that channel: the wrappers share one
// registry of CQs. Before they did, the channel's reader found no such CQ
// and dropped its events, and GetEvents waited for ever.
func TestVerbsSharedChannelAcrossWrappers(t *testing.T) {
	_, ip := rdmacmEnv(t)
	l := rdmacmListen(t, rdmacmChannel(t), rdmacm.PortSpaceTCP, verbs.QPTypeRC, netip.AddrPortFrom(ip, 20112))
	wa, wb := l.Context(), l.Context()
	require.NotNil(t, wa)
	require.NotNil(t, wb)
	require.NotSame(t, wa, wb, "two wrappers of one C context")
	cleanupClose(t, wa)
	cleanupClose(t, wb)

	ch, err := wa.NewSharedCompChannel()
	require.NoError(t, err)
	cleanupClose(t, ch)
	pd, err := wb.AllocPD()
	require.NoError(t, err)
	cleanupClose(t, pd)
	cqB, err := wb.CreateCQ(16, ch, 0) // the other wrapper's channel
	require.NoError(t, err)
	cleanupClose(t, cqB)
	cqA, err := wa.CreateCQ(16, ch, 0)
	require.NoError(t, err)
	cleanupClose(t, cqA)
	mr, err := pd.RegMR(4096, verbs.AccessLocalWrite)
	require.NoError(t, err)
	cleanupClose(t, mr)
	snd, rcv := smallRCQP(t, pd, cqA), smallRCQP(t, pd, cqB)
	connectRC(t, wb, snd, rcv)

	sendSeeingEvents(t, ch, cqA, cqB, snd, rcv, mr)
}
