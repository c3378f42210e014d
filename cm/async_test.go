package cm

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/verbs"
)

// Device events reach a connection through its device (async.go; on real
// soft-RoCE: test/integration's TestCMPortEvents). Here the connection's
// side: which events fail it, and with what.
func TestConnDeviceEvents(t *testing.T) {
	for _, tc := range []struct {
		ev   verbs.AsyncEvent
		want string // "" for an event that breaks nothing
	}{
		{verbs.AsyncEvent{Type: verbs.EventPortErr, Port: 1}, ""},
		{verbs.AsyncEvent{Type: verbs.EventPortActive, Port: 1}, ""},
		{verbs.AsyncEvent{Type: verbs.EventQPFatal, QPNum: 17}, "connection lost: the RDMA device reported QP_FATAL on the connection's queues"},
		{verbs.AsyncEvent{Type: verbs.EventQPAccessErr, QPNum: 17}, "QP_ACCESS_ERR"},
		{verbs.AsyncEvent{Type: verbs.EventCQErr}, "CQ_ERR"},
		{verbs.AsyncEvent{Type: verbs.EventDeviceFatal}, "connection lost: RDMA device removed: the device reported a fatal error (DEVICE_FATAL)"},
	} {
		t.Run(tc.ev.Type.String(), func(t *testing.T) {
			a, b, _ := fakePair(t, fakeOpts{})
			var logged []string
			a.log = func(msg string, _ ...any) { logged = append(logged, "warn: "+msg) }
			a.logInfo = func(msg string, _ ...any) { logged = append(logged, "info: "+msg) }
			ctx := ctxT(t)
			recvErr := make(chan error, 1)
			go func() {
				_, err := a.Recv(ctx, make([]byte, 256))
				recvErr <- err
			}()
			a.asyncEvent(tc.ev)
			if tc.want == "" {
				require.Len(t, logged, 1)
				require.NoError(t, b.Send(ctx, []byte("still here")))
				require.NoError(t, <-recvErr)
				return
			}
			err := <-recvErr
			require.ErrorIs(t, err, ErrPeerGone)
			require.ErrorContains(t, err, tc.want)
			require.ErrorIs(t, a.Send(context.Background(), []byte("x")), ErrPeerGone)
			require.Equal(t, []string{"warn: connection failed"}, logged)
			if tc.ev.Type == verbs.EventDeviceFatal {
				// Released without the application's Close, as on a
				// removal.
				require.ErrorIs(t, err, ErrDeviceRemoved)
				require.Eventually(t, func() bool {
					a.ioMu.RLock()
					defer a.ioMu.RUnlock()
					return a.released
				}, 5*time.Second, time.Millisecond)
			}
		})
	}
}
