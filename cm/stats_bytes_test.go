package cm

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Stats' BytesSent and BytesReceived count the payload bytes of every
// message (with or without immediate data), on RC and over XRC: no test
// read them, so a Conn counting half its bytes, or none, passed.
func TestStatsBytesCounted(t *testing.T) {
	check := func(t *testing.T, a, b *Conn) {
		ctx := ctxT(t)
		buf := make([]byte, 256)
		var want uint64
		for i := range 50 {
			msg := bytes.Repeat([]byte{byte(i)}, i+1)
			want += uint64(len(msg))
			require.NoError(t, a.Send(ctx, msg))
			n, err := b.Recv(ctx, buf)
			require.NoError(t, err)
			require.Equal(t, msg, buf[:n])
		}
		sa, sb := a.Stats(), b.Stats()
		require.Equal(t, uint64(50), sa.MessagesSent)
		require.Equal(t, uint64(50), sb.MessagesReceived)
		require.Equal(t, want, sa.BytesSent, "sender's bytes")
		require.Equal(t, want, sb.BytesReceived, "receiver's bytes")
		require.Zero(t, sa.BytesReceived)
		require.Zero(t, sb.BytesSent)
	}
	t.Run("rc", func(t *testing.T) {
		a, b, _ := fakePair(t, fakeOpts{})
		check(t, a, b)
		ctx := ctxT(t)
		require.NoError(t, b.SendWithImm(ctx, []byte("imm"), 7))
		_, _, _, err := a.RecvWithImm(ctx, make([]byte, 16))
		require.NoError(t, err)
		require.Equal(t, uint64(3), b.Stats().BytesSent, "immediate data's payload counted")
		require.Equal(t, uint64(3), a.Stats().BytesReceived)
	})
	t.Run("xrc", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		f := newFabric(t)
		c, s := fabricPair(ctx, t, f.Node("10.1.0.1").Process(), f.Node("10.1.0.2").Process(), nil, nil)
		check(t, c, s)
	})
}
