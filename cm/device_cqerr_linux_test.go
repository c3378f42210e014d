//go:build linux && cgo

package cm

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/verbs"
)

// A CQ the device reported CQ_ERR about takes no more completions (IBTA
// C11-37; NVIDIA's guide: destroy and recreate it). The connection failed,
// but its Close, once the CM left time-wait, reset the QP and kept the pair
// for the next connection of its sizes (qpcache.go), which would have
// waited on that CQ for ever. Soft-RoCE raises no CQ_ERR for a CQ that
// cannot overrun, so the event is handed to the device's handler, as its
// reader would. Runs in the VM (test/run-tests.sh, VM_RACE), a real device
// being needed.
func TestDeviceCQErrPairNotKept(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The listener holds the device: closed connections' pairs are kept.
	_, c, s := rxePair(ctx, t, WithMessageSize(256), WithQueueDepth(4))

	st := s.t.(*rdmaTransport)
	st.dev.handleAsync(verbs.AsyncEvent{Type: verbs.EventCQErr, CQ: st.cq})
	_, err := s.Recv(ctx, make([]byte, 256))
	require.ErrorIs(t, err, ErrPeerGone)
	require.ErrorContains(t, err, "CQ_ERR")

	// c stays up to answer s's disconnect: s's release sees TIMEWAIT_EXIT.
	require.NoError(t, s.Close())
	require.True(t, st.timewaitDone, "s's release did not see the time-wait end: nothing here is tested")
	st.dev.mu.Lock()
	kept := false
	for _, pairs := range st.dev.qps {
		for _, p := range pairs {
			kept = kept || p.cq == st.cq
		}
	}
	st.dev.mu.Unlock()
	require.False(t, kept, "the pair whose CQ reported CQ_ERR was kept for reuse")
	require.NoError(t, c.Close())
}
