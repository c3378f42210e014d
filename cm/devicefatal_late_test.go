package cm

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/verbs"
)

// A connection whose handshake completes just after its device reported
// DEVICE_FATAL (the dialer read ESTABLISHED while the device's event reader
// failed the connections it had) joins the device's connections (start,
// addConn) after the one event came. It heard nothing: its Sends went to
// the dead device, and Recv waited for completions that never come, until
// its context ended or, where the device sends one, the CM's
// DEVICE_REMOVAL. It now fails at once, as the connections that were there.
func TestDeviceFatalReachesConnectionAddedAfter(t *testing.T) {
	d := &device{conns: map[*rdmaTransport]struct{}{}, portDown: map[uint8]bool{}, fatal: make(chan struct{})}
	d.handleAsync(verbs.AsyncEvent{Type: verbs.EventDeviceFatal})

	a, _, _ := fakePair(t, fakeOpts{})
	d.addConn(&rdmaTransport{dev: d, onAsync: a.takeAsyncEvent})
	err := a.Send(context.Background(), []byte("x"))
	require.ErrorIs(t, err, ErrDeviceRemoved, "Send on a connection added after DEVICE_FATAL")
	_, err = a.Recv(ctxT(t), make([]byte, 256))
	require.ErrorIs(t, err, ErrDeviceRemoved, "Recv on a connection added after DEVICE_FATAL")
	<-a.freed // released by deviceLost's Close, as the others
}
