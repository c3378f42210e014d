//go:build linux && cgo

package cm

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/rdmacm"
	"github.com/goxrc/goxrc/test/softroce"
	"github.com/goxrc/goxrc/verbs"
)

// The device's async reader must never wait for devices' lock: closing an
// idle device (its idle timer, CloseIdleDevices, a reclaim for locked
// memory) holds that lock while it waits for the reader to end. A
// DEVICE_FATAL marked the device removed from the reader itself, so the
// reader waited for the lock whoever held it. Soft-RoCE raises no
// DEVICE_FATAL, so the event is handed to the reader's handler here, with
// the lock held as a closing would hold it. Runs in the VM (test/run-tests.sh,
// VM_RACE), a real device being needed.
func TestDeviceFatalReaderTakesNoDevicesLock(t *testing.T) {
	d, before := acquireRXE(t)
	d.release()
	require.Equal(t, before.DevicesIdle+1, GlobalStats().DevicesIdle, "the device idles")

	devices.Lock() // as a closing idle device holds it
	handled := make(chan struct{})
	go func() {
		d.handleAsync(verbs.AsyncEvent{Type: verbs.EventDeviceFatal})
		close(handled)
	}()
	select {
	case <-handled:
	case <-time.After(5 * time.Second):
		devices.Unlock()
		<-handled
		t.Fatal("the async reader's DEVICE_FATAL waited for devices' lock")
	}
	devices.Unlock()
	// Taken out of use and closed, at once rather than after its idle time.
	require.Eventually(t, func() bool {
		s := GlobalStats()
		return s.Devices == before.Devices && s.DevicesIdle == before.DevicesIdle
	}, 5*time.Second, 10*time.Millisecond, "the removed idle device did not close")
}

// A device with no anchor (its address leads librdmacm to another device
// first: one address on two devices) closes at its last release instead of
// idling: nothing would hear of its removal meanwhile, and the connection's
// id, destroyed right after, may be the last one holding librdmacm's
// context, which its kept objects must not outlive (found by a review).
// Soft-RoCE gives each netdev one device, so the anchor is taken away here.
// Runs in the VM.
func TestDeviceWithoutAnchorIsNotKept(t *testing.T) {
	d, before := acquireRXE(t)
	require.NotNil(t, d.anchor.id, "a device on soft-RoCE has its anchor")
	devices.Lock()
	d.anchor.close()
	d.anchor = anchor{}
	devices.Unlock()
	d.release()
	s := GlobalStats()
	require.Equal(t, before.DevicesIdle, s.DevicesIdle, "the device was kept idle")
	require.Equal(t, before.Devices, s.Devices, "the device is still open")
}

// acquireRXE takes soft-RoCE's device through a CM id bound to its address,
// as a connection would, with no device open before (their stats, before);
// the id and its channel go at the end of the test. It skips off the VM.
func acquireRXE(t *testing.T) (d *device, before ProcessStats) {
	_, ip := softroce.Device(t)
	CloseIdleDevices()
	before = GlobalStats()
	ch, err := rdmacm.NewEventChannel()
	require.NoError(t, err)
	t.Cleanup(func() { ch.Close() })
	id, err := ch.CreateID(rdmacm.PortSpaceTCP, verbs.QPTypeRC)
	require.NoError(t, err)
	t.Cleanup(func() { id.Close() })
	require.NoError(t, id.Bind(netip.AddrPortFrom(ip, 0)))
	d, err = acquireDevice(id)
	require.NoError(t, err)
	return d, before
}

// rxePair listens on soft-RoCE's address with opts, dials it with the same,
// and returns the listener and both ends, closed when the test ends (the
// ends first). It skips off the VM.
func rxePair(ctx context.Context, t *testing.T, opts ...Option) (l *Listener, c, s *Conn) {
	t.Helper()
	_, ip := softroce.Device(t)
	l, err := Listen(ctx, netip.AddrPortFrom(ip, 0).String(), opts...)
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	c, s = dialAccepted(ctx, t, l, opts...)
	return l, c, s
}
