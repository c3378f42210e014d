package cm

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A Close waiting for a credit to send its FIN is a call blocked on the
// connection: with WithKeepalive, the probes go on while it waits, so a peer
// whose node vanished without a word (power lost) is found as it would be
// for a blocked Send or Recv. The probes stopped at Close (a leftover of
// when they were credit frames, which a closing connection sends no more
// of): the Close waited out its whole bound (the handshake timeout, 30 s by
// default) for a credit that would never come, and on a device then gave
// the CM's time-wait no time at all, failing with "waiting for the CM to
// leave time-wait", where a found vanish releases at once.
func TestConnCloseWaitingForFinCreditHearsKeepalive(t *testing.T) {
	const depth = 4
	const timeout = 5 * time.Second
	a, _, w := starveFinWith(t, fakeOpts{depth: [2]int{depth, depth}, keepalive: 500 * time.Millisecond, timeout: timeout}, nil)
	// b's node vanishes: no disconnect, its device answers nothing; only
	// a probe can tell.
	w.mu.Lock()
	w.ends[1].shut = true
	w.mu.Unlock()
	start := time.Now()
	require.NoError(t, a.Close())
	took := time.Since(start)
	require.Less(t, took, timeout/2,
		"Close waited %v (its bound is %v) for a FIN credit from a peer its keepalive would have found gone", took, timeout)
	require.Equal(t, uint64(1), a.Stats().Errors, "the peer vanished: a failure")
}
