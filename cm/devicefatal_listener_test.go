package cm

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/verbs"
)

// A listener on a device that reports DEVICE_FATAL closes itself, as on the
// CM's DEVICE_REMOVAL (loop), which a failed device need not send: no
// request comes through a dead device. The listener was not told (only
// connections were), and Accept waited until its context ended, for ever
// with context.Background (NetListener's), holding the dead device. The
// listener is built here as Listen builds one on a device's address, with
// no CM id (Close takes a nil one), and its watch started as Listen starts
// it.
func TestDeviceFatalEndsListener(t *testing.T) {
	checkGoroutines(t)
	cfg, err := newConfig(nil)
	require.NoError(t, err)
	d := &device{
		conns: map[*rdmaTransport]struct{}{}, portDown: map[uint8]bool{}, fatal: make(chan struct{}),
		qps: map[qpShape][]cachedQP{}, refs: 2, listeners: 1, // the listener's, and another user's
	}
	l := &Listener{
		cfg: cfg, ch: &chanRef{refs: 2}, dev: d, ready: make(chan *Conn, 1), done: make(chan struct{}),
		inProgress: make(chan struct{}, 1),
	}
	l.ctx, l.stop = context.WithCancel(context.Background())
	globalStats.listeners.Add(1) // as Listen: Close counts it down
	go l.watchFatal()
	t.Cleanup(func() { l.Close() })

	accepted := make(chan error, 1)
	go func() {
		_, err := l.Accept(ctxT(t))
		accepted <- err
	}()
	d.handleAsync(verbs.AsyncEvent{Type: verbs.EventDeviceFatal})
	require.ErrorIs(t, <-accepted, ErrDeviceRemoved, "Accept on a listener whose device failed")
}
