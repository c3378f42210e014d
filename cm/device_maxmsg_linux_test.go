//go:build linux && cgo

package cm

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Both ends of an RC connection read their port's max_msg_sz, which caps
// the message size (fitDevice) and one-sided lengths. Debian 12's soft-RoCE
// (kernel 6.1) reports 8 MiB, under WithMessageSize's most, so the cap is
// seen here: a message of the capped size goes through whole, a one-sided
// operation one byte over the limit is refused and the connection goes on.
// A later kernel change raised rxe's to 2 GiB; there only
// the reading is checked. Runs in the VM (a real device).
func TestDeviceReportsMaxMessage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, c0, _ := rxePair(ctx, t)
	m := c0.t.maxMessage()
	t.Logf("max_msg_sz %d", m)
	require.Positive(t, m, "the port's max_msg_sz was not read")
	if m >= maxMessageSize+userImmLen {
		require.Equal(t, DefaultMessageSize, c0.MaxMessageSize())
		return
	}

	_, c, s := rxePair(ctx, t, WithMessageSize(maxMessageSize), WithQueueDepth(2))
	for _, conn := range []*Conn{c, s} {
		require.Equal(t, m, conn.t.maxMessage())
		require.Equal(t, m-userImmLen, conn.MaxMessageSize(), "capped at max_msg_sz less the frame header")
		require.Equal(t, m-userImmLen, conn.MaxRecvSize())
	}
	msg := bytes.Repeat([]byte("0123456789abcdef"), (m-userImmLen)/16+1)[:m-userImmLen]
	require.NoError(t, c.Send(ctx, msg))
	buf := make([]byte, len(msg))
	n, err := s.Recv(ctx, buf)
	require.NoError(t, err)
	require.True(t, n == len(msg) && bytes.Equal(buf, msg), "the capped-size message arrived %d bytes of %d, or changed", n, len(msg))
	require.ErrorIs(t, c.Send(ctx, append(msg, 'x')), ErrMessageTooLong)

	local, err := c.RegisterMemory(m+1, 0)
	require.NoError(t, err)
	defer local.Close()
	remote, err := s.RegisterMemory(m+1, RemoteWrite|RemoteRead)
	require.NoError(t, err)
	defer remote.Close()
	require.ErrorIs(t, c.WriteRemote(ctx, local, 0, m+1, remote.Descriptor(), 0), ErrMessageTooLong)
	require.ErrorIs(t, c.ReadRemote(ctx, local, 0, m+1, remote.Descriptor(), 0), ErrMessageTooLong)
	copy(local.Bytes(), msg)
	require.NoError(t, c.WriteRemote(ctx, local, 0, m, remote.Descriptor(), 0), "one-sided at the limit")
	require.True(t, bytes.Equal(remote.Bytes()[:len(msg)], msg))
	require.NoError(t, c.Send(ctx, []byte("still up")))
	n, err = s.Recv(ctx, buf)
	require.NoError(t, err)
	require.Equal(t, "still up", string(buf[:n]))
}
