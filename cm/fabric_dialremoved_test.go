package cm

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A Dial on a device that went away fails with ErrDeviceRemoved, and not
// ErrPeerGone: no connection was lost, none was made. So does an RC Dial
// (dialAddr), and so do an XRC listener's Listen and Accept
// (TestFabricAcceptAfterDeviceRemovalIsNotPeerGone). dialXRC mapped the
// engine's error as a connection's, "dial ...: connection lost: RDMA device
// removed: ...", both where the device had failed before the Dial (its
// shared endpoint is dead, and a new one does not open) and where it
// failed while the Dial waited for its peer.
func TestFabricDialOnRemovedDeviceIsNotPeerGone(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	f := newFabric(t)
	l := holdingListener(ctx, t, f.Node("10.1.0.1").Process())
	f.Node("10.1.0.9").PowerOff() // answers nothing: a Dial to it waits
	cli := f.Node("10.1.0.2").Process()
	dopts := []Option{WithFabric(cli), WithDomainPath(filepath.Join(t.TempDir(), "d"))}
	c, err := Dial(ctx, l.Addr().String(), dopts...) // opens the shared dialer endpoint
	require.NoError(t, err)
	defer c.Close()

	waiting := make(chan error, 1)
	go func() {
		_, err := Dial(ctx, "10.1.0.9:7471", dopts...)
		waiting <- err
	}()
	time.Sleep(100 * time.Millisecond)
	f.Node("10.1.0.2").FailDevice()
	check := func(what string, err error) {
		t.Helper()
		require.ErrorIs(t, err, ErrDeviceRemoved, what)
		require.NotErrorIs(t, err, ErrPeerGone, "%s: a Dial's error is no lost connection: %v", what, err)
		var oe *OpError
		require.ErrorAs(t, err, &oe, what)
		require.Equal(t, "dial", oe.Op, what)
	}
	select {
	case err := <-waiting:
		check("the device failed during the Dial", err)
	case <-ctx.Done():
		t.Fatal("the waiting Dial did not end with the device")
	}
	_, err = Dial(ctx, l.Addr().String(), dopts...)
	check("the device failed before the Dial", err)

	// Listen on the failed device, for comparison: ErrDeviceRemoved alone.
	_, err = Listen(ctx, "10.1.0.2:0", WithFabric(cli), WithDomainPath(filepath.Join(t.TempDir(), "l")))
	require.ErrorIs(t, err, ErrDeviceRemoved)
	require.NotErrorIs(t, err, ErrPeerGone)
}
