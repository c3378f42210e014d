package cm

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/verbs"
)

// A device's DEVICE_FATAL fails every connection on it, each one in turn
// on the device's event reader, which wrote each one's "connection failed"
// before it told the next: a slow or blocked handler (WithLogger) kept the
// connections after it working on the dead device, their calls waiting for
// completions that never come, and their resources on it, for as long as
// it ran. The reader now fails them all first and writes their records
// after.
func TestLoggerHandlerOnDeviceFatalDelaysNoConnection(t *testing.T) {
	d := &device{conns: map[*rdmaTransport]struct{}{}, portDown: map[uint8]bool{}, fatal: make(chan struct{})}
	entered, unblock := make(chan struct{}), make(chan struct{})
	var first sync.Once
	block := func() {
		first.Do(func() {
			close(entered)
			<-unblock
		})
	}
	var conns []*Conn
	for range 2 {
		c, _, _ := fakePair(t, fakeOpts{})
		useLogger(t, c, newCallbackHandler(block))
		// Joined as Dial's start joins it (see startScene).
		globalStats.connsOpen.Add(-1) // fakePair counted c as open: start counts it
		rt := &rdmaTransport{dev: d, events: make(chan struct{}), settled: make(chan struct{}), disconnected: make(chan struct{})}
		require.NoError(t, c.start(rt))
		conns = append(conns, c)
	}
	handled := make(chan struct{})
	go func() {
		d.handleAsync(verbs.AsyncEvent{Type: verbs.EventDeviceFatal})
		close(handled)
	}()
	<-entered
	for i, c := range conns {
		recvErr := make(chan error, 1)
		go func() {
			_, err := c.Recv(ctxT(t), make([]byte, 64))
			recvErr <- err
		}()
		select {
		case err := <-recvErr:
			require.ErrorIs(t, err, ErrDeviceRemoved, "connection %d", i)
		case <-time.After(5 * time.Second):
			close(unblock)
			<-handled
			t.Fatalf("connection %d not failed by DEVICE_FATAL while another's log handler ran", i)
		}
	}
	close(unblock)
	<-handled
	for _, c := range conns {
		<-c.freed // released by deviceLost's Close
		require.Equal(t, uint64(1), c.Stats().Errors)
	}
}
