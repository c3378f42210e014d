package cm

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The reaper's delay starts short again when the application comes back
// after an idle spell. It stays armed through the spell wherever credits
// are out or buffers are held (any connection that has carried a message
// and its reply), backed off to a second; a data post or a read armed it
// only when it was not armed, so it stayed at a second, and a reader that
// then stopped calling left its sender waiting up to a second, not 100 ms,
// for the buffers it had freed (TestConnIdleReaderOwesNoCredit, after an
// idle spell). The timers here run only by hand.
func TestConnReaperComesBackAfterIdle(t *testing.T) {
	a, b, _ := fakePair(t, fakeOpts{depth: [2]int{4, 4}})
	for _, c := range []*Conn{a, b} { // their timers run nothing: see the loop below
		c.mu.Lock()
		c.reapTimer = time.AfterFunc(time.Hour, func() {})
		c.persistTimer = time.AfterFunc(time.Hour, func() {})
		c.mu.Unlock()
	}
	ctx := ctxT(t)
	buf := make([]byte, 256)
	require.NoError(t, a.Send(ctx, []byte("m")))
	_, err := b.Recv(ctx, buf) // b holds a's buffer, below the threshold
	require.NoError(t, err)
	// Both idle: b's reaper backs off to its longest delay.
	for range 10 {
		b.mu.Lock()
		armed := b.reapArmed
		b.mu.Unlock()
		require.True(t, armed, "b's reaper stopped with a's buffer held")
		b.reap()
	}
	b.mu.Lock()
	require.Equal(t, maxReap, b.reapDelay)
	b.mu.Unlock()
	// The applications come back: a sends, b reads, and b stops calling.
	require.NoError(t, a.Send(ctx, []byte("m")))
	_, err = b.Recv(ctx, buf)
	require.NoError(t, err)
	b.mu.Lock()
	defer b.mu.Unlock()
	require.True(t, b.reapArmed)
	require.Equal(t, maxReapBusy, b.reapDelay, "b's reaper's next look after its application's read")
}
