package cm

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/verbs"
)

// A device event's records (a port going down, a connection failed by a
// QP or device error) are written on the device's event reader, which
// runs the application's handler (WithLogger). Closing a device (its last
// user letting go of a removed or anchorless one, the idle timer,
// CloseIdleDevices, a reclaim for locked memory) waited for that reader
// to end while it held devices' lock: a slow or blocked handler held the
// lock, and with it every Dial, Listen, handshake and connection release
// of the process, on every device. Here the handler blocks on the port's
// record while the device's last user lets go of it.
func TestLoggerHandlerOnDeviceEventHoldsNoDevicesLock(t *testing.T) {
	a, _, _ := fakePair(t, fakeOpts{})
	entered, unblock := make(chan struct{}), make(chan struct{})
	h := newCallbackHandler(func() {
		close(entered)
		<-unblock
	})
	useLogger(t, a, h)
	pumped := make(chan struct{})
	close(pumped) // no completion channel: no pump to wait for
	d := &device{
		name: "logger-device", refs: 1, gone: true, pool: newPoolOn(nil), pumpDone: pumped,
		conns: map[*rdmaTransport]struct{}{}, portDown: map[uint8]bool{}, fatal: make(chan struct{}),
		asyncDone: make(chan struct{}),
	}
	globalStats.devices.Add(1) // as acquireDevice counts it: closeLocked takes it back
	// Joined as Dial's start joins it; the transport has no CM id (port 0,
	// a watcher that ends at once), as in startScene.
	globalStats.connsOpen.Add(-1) // fakePair counted a as open: start counts it
	rt := &rdmaTransport{dev: d, events: make(chan struct{}), settled: make(chan struct{}), disconnected: make(chan struct{})}
	require.NoError(t, a.start(rt))
	events := make(chan verbs.AsyncEvent, 1)
	events <- verbs.AsyncEvent{Type: verbs.EventPortErr, Port: rt.port}
	close(events) // as the context's close ends them, after this one
	go d.readAsync(events)
	<-entered

	released := make(chan struct{})
	go func() {
		d.release() // the last user of a removed device: it closes now
		close(released)
	}()
	select {
	case <-released:
	case <-time.After(5 * time.Second):
		locked := !devices.TryLock()
		if !locked {
			devices.Unlock()
		}
		close(unblock)
		<-released
		t.Fatalf("closing the device waited for the application's log handler (devices' lock held: %v)", locked)
	}
	require.True(t, devices.TryLock(), "devices' lock is free while the handler runs")
	devices.Unlock()
	close(unblock)
	<-d.asyncDone
	require.Equal(t, []string{"WARN: RDMA port down: the connection fails unless the port comes back before the transport's retries run out"}, h.logged())
}
