//go:build linux && cgo

package cm

import (
	"context"
	"net/netip"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/internal/faults"
	"github.com/goxrc/goxrc/test/softroce"
	"github.com/goxrc/goxrc/verbs"
)

// A Dial whose device fails (DEVICE_FATAL, which the device's event reader
// hears) during the handshake fails at the next step on the device with
// its errno (EIO), and said only that: not ErrDeviceRemoved, which a Dial
// whose device the CM reports removed, a connection and a listener on the
// failed device all say. Soft-RoCE raises no DEVICE_FATAL: the step's C
// call hands the event to the device's reader, as it comes just before
// the call on a failing device, and fails EIO. The dialer's QP move to
// INIT is the first ibv_modify_qp (the listener makes its QP on the
// request, after it), in newRDMATransport, before the Dial has a
// transport; rdma_establish is the dialer's last step, with one. Runs in
// the VM, a real device being needed.
func TestDeviceFatalInHandshakeFailsTheDial(t *testing.T) {
	name, ip := softroce.Device(t)
	for _, op := range []string{"ibv_modify_qp", "rdma_establish"} {
		t.Run(op, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			l, err := Listen(ctx, netip.AddrPortFrom(ip, 0).String())
			require.NoError(t, err)
			t.Cleanup(func() { l.Close() })
			var fired atomic.Bool
			var failed atomic.Pointer[device]
			unset := faults.Set(func(o string) error {
				if o != op || !fired.CompareAndSwap(false, true) {
					return nil
				}
				devices.Lock()
				d := devices.m[name]
				devices.Unlock()
				if d == nil {
					return nil // reported below
				}
				failed.Store(d)
				d.handleAsync(verbs.AsyncEvent{Type: verbs.EventDeviceFatal})
				return syscall.EIO
			})
			defer unset()
			c, err := Dial(ctx, l.Addr().String())
			if c != nil {
				c.Close()
			}
			require.NotNil(t, failed.Load(), "%s was not called on device %s: nothing here is tested", op, name)
			require.ErrorIs(t, err, ErrDeviceRemoved, "a Dial whose device failed at %s", op)
			if op == "ibv_modify_qp" {
				require.ErrorIs(t, err, syscall.EIO, "the step's own error is kept")
			}
			// At rdma_establish the listener, on the same failed device,
			// has dropped the request: the REJ it sent explains the
			// failed RTU (rejectedMeanwhile), not the EIO.
		})
	}
}
