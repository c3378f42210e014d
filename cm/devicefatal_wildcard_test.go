package cm

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/rdmacm"
	"github.com/goxrc/goxrc/verbs"
)

// A listener on an unspecified address holds each device it accepted a
// connection on (wildcard.go) and let go of one only on the CM's
// DEVICE_REMOVAL, which a device that reports DEVICE_FATAL need not send
// (Listener.watchFatal): it held the dead device (its context, PD and
// registered buffers, out of reach of the locked-memory reclaim once the
// device left the devices map) and its id until Close, where doc.go says a
// fatal device is handled as a removal, which it lets go of. The listener
// is built as TestDeviceFatalEndsListener's, holding the device with a nil
// id (whose Close does nothing), and the fatal watch started as watchHeld
// starts it.
func TestDeviceFatalLetsWildcardListenerGo(t *testing.T) {
	hold := func(t *testing.T) (*Listener, *device, chan struct{}) {
		checkGoroutines(t)
		cfg, err := newConfig(nil)
		require.NoError(t, err)
		d := &device{
			conns: map[*rdmaTransport]struct{}{}, portDown: map[uint8]bool{}, fatal: make(chan struct{}),
			qps: map[qpShape][]cachedQP{}, refs: 2, listeners: 1, // the listener's, and a connection's
		}
		l := &Listener{
			cfg: cfg, ch: &chanRef{refs: 2}, ready: make(chan *Conn, 1), done: make(chan struct{}),
			inProgress: make(chan struct{}, 1), held: map[*device]*rdmacm.ID{d: nil},
		}
		l.ctx, l.stop = context.WithCancel(context.Background())
		globalStats.listeners.Add(1) // as Listen: Close counts it down
		ended := make(chan struct{}) // watchHeld's end
		l.heldWG.Go(func() { l.watchHeldFatal(d, nil, ended) })
		t.Cleanup(func() { l.Close() })
		return l, d, ended
	}
	holds := func(l *Listener, d *device) (held bool, listeners, refs int) {
		l.heldMu.Lock()
		_, held = l.held[d]
		l.heldMu.Unlock()
		devices.Lock()
		defer devices.Unlock()
		return held, d.listeners, d.refs
	}

	t.Run("fatal", func(t *testing.T) {
		l, d, _ := hold(t)
		d.handleAsync(verbs.AsyncEvent{Type: verbs.EventDeviceFatal})
		l.heldWG.Wait() // the watch ends once it let go
		held, listeners, refs := holds(l, d)
		require.False(t, held, "the wildcard listener still holds the device that reported DEVICE_FATAL")
		require.Equal(t, 0, listeners, "listeners holding the failed device")
		require.Equal(t, 1, refs, "references left: the connection's")
	})
	t.Run("removal first", func(t *testing.T) {
		// The removal's watch let go (or Close did) and ended: the fatal
		// watch ends with it, holding no goroutine for the listener's
		// life (a leak for TestCMDeviceRemoval's check, taken with its
		// wildcard listener open), and lets go of nothing more.
		l, d, ended := hold(t)
		close(ended)
		l.heldWG.Wait()
		held, listeners, refs := holds(l, d)
		require.True(t, held, "the fatal watch let go with no DEVICE_FATAL")
		require.Equal(t, 1, listeners)
		require.Equal(t, 2, refs)
	})
}
