package cm

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/verbs"
)

// A connection established just after its device reported DEVICE_FATAL
// (the dialer, or a listener's handshake, read ESTABLISHED as the device's
// event reader failed the connections it had) was failed as it joined the
// device (addConn), and Dial returned it all the same, as a listener queued
// it for Accept: a connection whose first call said ErrDeviceRemoved, where
// an XRC Dial fails (TestFabricDialOnRemovedDeviceIsNotPeerGone). start,
// which both run last, now fails with ErrDeviceRemoved once the connection
// is released, and counts no connection established. The event comes
// before start, anywhere before addConn, which the device's lock orders
// against the event reader. The fake's Conn stands for Dial's, with an
// rdmaTransport that has no CM id (its watcher ends at once), as in
// TestDeviceFatalReachesConnectionAddedAfter.
func TestDeviceFatalBeforeStartFailsTheDial(t *testing.T) {
	d := &device{conns: map[*rdmaTransport]struct{}{}, portDown: map[uint8]bool{}, fatal: make(chan struct{})}
	a, _, _ := fakePair(t, fakeOpts{})
	globalStats.connsOpen.Add(-1) // fakePair counted a as open: start counts it, as Dial's does
	before := GlobalStats()
	rt := &rdmaTransport{dev: d, events: make(chan struct{}), settled: make(chan struct{}), disconnected: make(chan struct{})}

	d.handleAsync(verbs.AsyncEvent{Type: verbs.EventDeviceFatal})
	err := a.start(rt)
	require.ErrorIs(t, err, ErrDeviceRemoved, "start of a connection established after DEVICE_FATAL: Dial returned a failed connection")
	require.NotErrorIs(t, err, ErrPeerGone, "a Dial's error is no lost connection")
	select {
	case <-a.freed:
	default:
		t.Fatal("start failed before the connection was released: Dial would leave its QP and id behind")
	}
	<-rt.events // the watcher ended
	after := GlobalStats()
	require.Equal(t, before.ConnectionsOpen, after.ConnectionsOpen, "connections left open")
	require.Equal(t, before.ConnectionsTotal, after.ConnectionsTotal, "a failed Dial counted as a connection established")
}
