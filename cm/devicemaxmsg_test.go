package cm

import (
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// WithMessageSize(1 GiB), the documented most, on a device whose largest
// message (its port's max_msg_sz) is 1 GiB, as mlx5's is: a framed
// message of 1 GiB is a work request 4 bytes longer (the frame header),
// which the device fails, and the connection with it. Dial and the
// listener's handshake fit the size to the device (fitDevice) before they
// size buffers, the hello and the connection's limits: MaxMessageSize is
// then 4 bytes less, and a Send of 1 GiB gets ErrMessageTooLong. Raw
// messages have no header; a device that reports nothing caps nothing.
func TestMessageSizeFitsDeviceMaxMessage(t *testing.T) {
	const limit = 1 << 30
	for _, tc := range []struct {
		name   string
		opts   []Option
		maxMsg int
		want   int
	}{
		{"framed at the device's limit", []Option{WithMessageSize(maxMessageSize)}, limit, limit - userImmLen},
		{"framed under it", []Option{WithMessageSize(limit - userImmLen)}, limit, limit - userImmLen},
		{"framed, smaller", []Option{WithMessageSize(1 << 20)}, limit, 1 << 20},
		{"raw at the device's limit", []Option{WithMessageSize(maxMessageSize), WithRawMessages()}, limit, limit},
		{"framed, a smaller device", []Option{WithMessageSize(4096)}, 1024, 1024 - userImmLen},
		{"later rxe's 2 GiB (less one byte, on a 32-bit int)", []Option{WithMessageSize(maxMessageSize)}, math.MaxInt32, maxMessageSize},
		{"nothing reported", []Option{WithMessageSize(maxMessageSize)}, 0, maxMessageSize},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := newConfig(tc.opts)
			require.NoError(t, err)
			cfg.fitDevice(tc.maxMsg)
			require.Equal(t, tc.want, cfg.messageSize)
			sendSlots, recvSlots, hdr := cfg.slots()
			if tc.maxMsg > 0 {
				require.LessOrEqual(t, cfg.messageSize+hdr, tc.maxMsg, "a work request longer than the device's largest message")
			}
			p := cfg.params(sendSlots, recvSlots)
			require.Equal(t, tc.want, p.maxSend, "MaxMessageSize")
			require.Equal(t, tc.want, p.maxRecv, "MaxRecvSize")
		})
	}
}
