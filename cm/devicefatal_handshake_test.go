package cm

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/verbs"
)

// A handshake step on a device that reported DEVICE_FATAL fails, as every
// call on a failed device does (EIO), and said only that: the Dial's error
// did not match ErrDeviceRemoved, which a Dial on a failed device returns
// (ErrDeviceRemoved's doc), as a connection and a listener on it say.
// newRDMATransport, the steps that build the connection's queues, runs
// here on a device that failed, taken by name as a Dial takes it, before
// the event reader's removed() took it out of use; it has no context,
// which the CQ's create meets first, as it would meet the dead device's
// EIO. The steps after it (dialAddr's) need a device:
// TestDeviceFatalInHandshakeFailsTheDial, in the VM.
func TestTransportOnFailedDeviceIsDeviceRemoved(t *testing.T) {
	d := &device{conns: map[*rdmaTransport]struct{}{}, portDown: map[uint8]bool{}, fatal: make(chan struct{}), qps: map[qpShape][]cachedQP{}, refs: 1}
	close(d.fatal) // as handleAsync does on DEVICE_FATAL
	devices.Lock()
	if devices.m == nil {
		devices.m = map[string]*device{}
	}
	require.Nil(t, devices.m[""], "a device without a name is open")
	devices.m[""] = d // a nil id's DeviceName
	devices.Unlock()
	t.Cleanup(func() {
		devices.Lock()
		delete(devices.m, "")
		devices.Unlock()
	})

	tr, err := newRDMATransport(nil, verbs.QPStateInit, dialerMoves, 2, 2, 64, 64, 0)
	require.Nil(t, tr)
	require.Error(t, err)
	require.ErrorIs(t, err, ErrDeviceRemoved, "a handshake step on a failed device")
	devices.Lock()
	defer devices.Unlock()
	require.Equal(t, 1, d.refs, "the step's reference on the device was not given back")
}
