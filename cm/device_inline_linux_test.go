//go:build linux && cgo

package cm

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// WithInlineThreshold above what the device inlines: soft-RoCE refuses a QP
// asking for 4096 bytes of inline data (EINVAL), and the retry asked for
// none, which left what the provider gives a QP asking none (16 bytes on
// soft-RoCE): less than the default threshold asks for. Both ends now
// inline what the device took (512 bytes on soft-RoCE), and messages on
// either side of that size arrive intact. Runs in the VM
// (test/run-tests.sh, VM_RACE), a real device being needed.
func TestDeviceInlineAboveWhatTheDeviceTakes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const size = 4096
	_, c, s := rxePair(ctx, t, WithInlineThreshold(size), WithMessageSize(size), WithQueueDepth(4))

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
