//go:build linux && cgo

package cm

import (
	"bytes"
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/test/softroce"
)

// WithInlineThreshold above what the device inlines: soft-RoCE refuses a QP
// asking for 4096 bytes of inline data (EINVAL), and the retry asked for
// none, which left what the provider gives a QP asking none (16 bytes on
// soft-RoCE): less than the default threshold asks for. Both ends now
// inline what the device took (512 bytes on soft-RoCE), and messages on
// either side of that size arrive intact. Runs in the VM
// (test/run-tests.sh, VM_RACE), a real device being needed.
func TestDeviceInlineAboveWhatTheDeviceTakes(t *testing.T) {
	_, ip := softroce.Device(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const size = 4096
	opts := []Option{WithInlineThreshold(size), WithMessageSize(size), WithQueueDepth(4)}
	l, err := Listen(ctx, netip.AddrPortFrom(ip, 0).String(), opts...)
	require.NoError(t, err)
	defer l.Close()
	c, s := dialAccepted(ctx, t, l, opts...)

	inline := c.t.(*rdmaTransport).inline
	t.Logf("inline data per send: %d bytes", inline)
	require.GreaterOrEqual(t, inline, DefaultInlineThreshold, "less inline data than the default asks for")
	require.Less(t, inline, size, "the device took all of it: nothing here is tested")
	require.Equal(t, inline, s.t.(*rdmaTransport).inline, "the acceptor's QP on the same device")

	buf := make([]byte, size)
	for _, n := range []int{1, inline, inline + 1, size} {
		msg := bytes.Repeat([]byte{byte(n)}, n)
		require.NoError(t, c.Send(ctx, msg))
		got, err := s.Recv(ctx, buf)
		require.NoError(t, err)
		require.Equal(t, msg, buf[:got], "a message of %d bytes", n)
	}
}
