package cm

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Stats read while a post the device refuses is under way does not count
// that message: its Send fails, and a counter read a moment later must not
// be lower (a monitor takes a counter that goes back for a reset).
func TestStatsRefusedPostNeverCounted(t *testing.T) {
	a, _, w := fakePair(t, fakeOpts{})
	ctx := ctxT(t)
	require.NoError(t, a.Send(ctx, []byte("counted")))
	var during Stats
	w.mu.Lock()
	w.ends[0].postFails = true
	w.ends[0].posting = func() { during = a.Stats() }
	w.mu.Unlock()
	require.ErrorIs(t, a.Send(ctx, []byte("refused")), ErrPeerGone)
	require.Equal(t, uint64(1), during.MessagesSent, "read during the refused post")
	require.Equal(t, uint64(len("counted")), during.BytesSent, "read during the refused post")
	after := a.Stats()
	require.Equal(t, uint64(1), after.MessagesSent)
	require.Equal(t, uint64(len("counted")), after.BytesSent)
}
