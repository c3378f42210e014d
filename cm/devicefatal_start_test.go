package cm

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/rdmacm"
	"github.com/goxrc/goxrc/verbs"
)

// startScene is a connection about to start on a device of its own: the
// fake's Conn stands for Dial's, with an rdmaTransport that has no CM id
// (its watcher ends at once), as in TestDeviceFatalReachesConnectionAddedAfter.
// Its logger records what it logs.
func startScene(t *testing.T) (*device, *Conn, callbackHandler, *rdmaTransport) {
	d := &device{conns: map[*rdmaTransport]struct{}{}, portDown: map[uint8]bool{}, fatal: make(chan struct{})}
	a, _, _ := fakePair(t, fakeOpts{})
	globalStats.connsOpen.Add(-1) // fakePair counted a as open: start counts it, as Dial's does
	h := newCallbackHandler(func() {})
	useLogger(t, a, h)
	rt := &rdmaTransport{dev: d, events: make(chan struct{}), settled: make(chan struct{}), disconnected: make(chan struct{})}
	return d, a, h, rt
}

// requireDropped checks what start's failure leaves: the connection
// released, nothing counted, no connection's failure logged (no connection
// was handed out: Dial's error or the listener's failed handshake says it).
func requireDropped(t *testing.T, err error, a *Conn, h callbackHandler, rt *rdmaTransport, before ProcessStats) {
	t.Helper()
	require.ErrorIs(t, err, ErrDeviceRemoved, "start of a connection on a lost device: Dial returned a failed connection")
	require.NotErrorIs(t, err, ErrPeerGone, "a Dial's error is no lost connection")
	select {
	case <-a.freed:
	default:
		t.Fatal("start failed before the connection was released: Dial would leave its QP and id behind")
	}
	<-rt.events // the watcher ended
	require.Empty(t, h.logged(), "a connection never handed out logged its failure")
	after := GlobalStats()
	require.Equal(t, before.ConnectionsOpen, after.ConnectionsOpen, "connections left open")
	require.Equal(t, before.ConnectionsTotal, after.ConnectionsTotal, "a failed Dial counted as a connection established")
}

// A connection established just after its device reported DEVICE_FATAL
// (the dialer, or a listener's handshake, read ESTABLISHED as the device's
// event reader failed the connections it had) was failed as it joined the
// device (addConn), and Dial returned it all the same, as a listener queued
// it for Accept: a connection whose first call said ErrDeviceRemoved, where
// an XRC Dial fails (TestFabricDialOnRemovedDeviceIsNotPeerGone). start,
// which both run last, now fails with ErrDeviceRemoved once the connection
// is released, and counts no connection established. The event comes
// before start, anywhere before addConn, which the device's lock orders
// against the event reader. Such a connection also logged "connection
// failed" at Warn, which a Dial failing in its handshake never does, and a
// listener logged the one handshake twice.
func TestDeviceFatalBeforeStartFailsTheDial(t *testing.T) {
	d, a, h, rt := startScene(t)
	before := GlobalStats()
	d.handleAsync(verbs.AsyncEvent{Type: verbs.EventDeviceFatal})
	requireDropped(t, a.start(rt), a, h, rt, before)
}

// The CM's DEVICE_REMOVAL (the event soft-RoCE sends; DEVICE_FATAL may not
// come) that arrived between the handshake's last event and start waited
// on the id for the watcher start begins: Dial returned the connection,
// and the watcher failed it just after. start now reads the id's flag,
// which the CM's event pump sets as it queues the event, and fails the
// same way. The flag is set here through idRemoved (no id exists off a
// device); the transport has no id, so its watcher ends at once and only
// start's own reading can fail it.
func TestDeviceRemovalBeforeStartFailsTheDial(t *testing.T) {
	_, a, h, rt := startScene(t)
	before := GlobalStats()
	idRemoved = func(*rdmacm.ID) bool { return true } // DEVICE_REMOVAL queued on the id
	t.Cleanup(func() { idRemoved = (*rdmacm.ID).DeviceRemoved })
	requireDropped(t, a.start(rt), a, h, rt, before)
}

// DEVICE_FATAL read as start runs: the connection is either dropped by
// start (ErrDeviceRemoved, no failure logged) or handed out and failed
// after, its failure logged once; never handed out unlogged, nor dropped
// and logged. Run with -race.
func TestDeviceFatalDuringStartDropsOrLogsOnce(t *testing.T) {
	for range 20 {
		d, a, h, rt := startScene(t)
		var wg sync.WaitGroup
		wg.Go(func() { d.handleAsync(verbs.AsyncEvent{Type: verbs.EventDeviceFatal}) })
		err := a.start(rt)
		wg.Wait()
		<-a.freed // the loss released it, before start returned or after
		<-rt.events
		if err != nil {
			require.ErrorIs(t, err, ErrDeviceRemoved)
			require.Empty(t, h.logged(), "a dropped connection logged its failure")
		} else {
			require.Equal(t, []string{"WARN: connection failed"}, h.logged(), "a connection handed out and failed")
		}
	}
}

// The peer's disconnect, which the connection's watcher handles as start
// runs (the CM's DISCONNECTED, queued on the id before it), fails the
// connection by the flush its reaper takes in; a DEVICE_FATAL read after
// it, still before start hands the connection out, drops it. The peer's
// failure was logged at Warn all the same: "connection failed" of a
// connection no application saw. The watcher's call is made from
// idRemoved, which start calls once the watcher runs.
func TestPeerGoneThenDeviceFatalDuringStartLogsNothing(t *testing.T) {
	d, a, h, rt := startScene(t)
	before := GlobalStats()
	idRemoved = func(*rdmacm.ID) bool {
		a.peerGone("peer disconnected") // the watcher's
		a.mu.Lock()
		err := a.err
		a.mu.Unlock()
		require.ErrorIs(t, err, ErrPeerGone, "the peer's disconnect did not fail the connection")
		d.handleAsync(verbs.AsyncEvent{Type: verbs.EventDeviceFatal})
		return false
	}
	t.Cleanup(func() { idRemoved = (*rdmacm.ID).DeviceRemoved })
	requireDropped(t, a.start(rt), a, h, rt, before)
}

// The peer's disconnect alone, handled as start runs, leaves a connection
// that start hands out, failed: its failure is logged once, as the
// connection is handed out.
func TestPeerGoneDuringStartLogsOnce(t *testing.T) {
	_, a, h, rt := startScene(t)
	idRemoved = func(*rdmacm.ID) bool {
		a.peerGone("peer disconnected") // the watcher's
		return false
	}
	t.Cleanup(func() { idRemoved = (*rdmacm.ID).DeviceRemoved })
	require.NoError(t, a.start(rt))
	<-rt.events
	require.Equal(t, []string{"WARN: connection failed"}, h.logged(), "a connection handed out and failed")
	_, err := a.Recv(context.Background(), make([]byte, 512))
	require.ErrorIs(t, err, ErrPeerGone)
}
