//go:build linux && cgo

package cm

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/internal/faults"
	"github.com/goxrc/goxrc/verbs"
)

// A CQ_ERR about a cached pair has the event reader destroy the pair after
// it let go of the device's lock (cqErrLocked), holding no reference on the
// device. A device closed meanwhile (its last listener gone, then
// CloseIdleDevices) found the CQ still open: its channel and context
// refused to close (EBUSY) and were left open for good. The pair's CQ
// destroy is held here until the device's close has had its chance. Runs
// in the VM, a real device being needed.
func TestDeviceCQErrPairClosedBeforeDevice(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, c, s := rxePair(ctx, t, WithMessageSize(256), WithQueueDepth(4))
	st := s.t.(*rdmaTransport)
	d := st.dev
	require.NoError(t, s.Close())
	require.True(t, st.cqKept, "s's pair was not cached: nothing here is tested")

	var calls atomic.Int32
	entered, release := make(chan struct{}), make(chan struct{})
	unset := faults.Set(func(op string) error {
		if op == "ibv_destroy_cq" && calls.Add(1) == 1 {
			close(entered)
			<-release
		}
		return nil
	})
	defer unset()
	handled := make(chan struct{})
	go func() {
		defer close(handled)
		d.handleAsync(verbs.AsyncEvent{Type: verbs.EventCQErr, CQ: st.cq})
	}()
	<-entered // the pair is out of the cache, its CQ being destroyed
	require.NoError(t, c.Close())
	require.NoError(t, l.Close())
	devices.Lock()
	idle := d.idle != nil
	devices.Unlock()
	require.True(t, idle, "the device is not idle: nothing here is tested")

	closed := make(chan struct{})
	go func() {
		defer close(closed)
		CloseIdleDevices()
	}()
	// The close waits for the pair's destroy; before, it went on at once.
	select {
	case <-closed:
	case <-time.After(time.Second):
	}
	close(release)
	<-closed
	<-handled
	err := d.ctx.Close()
	if err != nil {
		d.cc.Close() // for the tests after this one
		d.ctx.Close()
	}
	require.NoError(t, err, "the device's context was left open")
}
