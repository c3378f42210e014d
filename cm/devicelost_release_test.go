package cm

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/verbs"
)

// A connection whose device reported DEVICE_FATAL lets go of the device at
// once (async.go), as on a removal: its release waits for no time-wait. It
// waited (bounded by the handshake timeout) for a TIMEWAIT_EXIT or the CM's
// DEVICE_REMOVAL, neither of which a failed device need send, holding the
// device and the application's Close meanwhile. The fake's release records
// whether it was told not to wait.
func TestDeviceFatalReleasesWithoutTimewait(t *testing.T) {
	a, _, w := fakePair(t, fakeOpts{})
	a.asyncEvent(verbs.AsyncEvent{Type: verbs.EventDeviceFatal})
	<-a.freed // released by deviceLost's Close
	w.mu.Lock()
	defer w.mu.Unlock()
	require.True(t, w.ends[0].releasedVanished, "the release after DEVICE_FATAL waited for the CM's time-wait")
}
