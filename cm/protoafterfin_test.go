package cm

import (
	"io"
	"testing"

	"github.com/stretchr/testify/require"
)

// A peer's protocol error after its FIN breaks the connection even where
// the CM's word of its disconnect came before a round took the frames in:
// the flush after a FIN is the orderly end, a frame that breaks the
// protocol is not. Credits beyond the window and a sequence gap after the
// FIN were taken for the orderly end (no error counted, nothing logged),
// where data after it was counted.
func TestProtocolErrorAfterFinCountedBeforeDisconnect(t *testing.T) {
	for name, bad := range map[string]func(peerSlots int) frameHeader{
		"credits beyond the window": func(peerSlots int) frameHeader {
			return frameHeader{kind: frameCredit, credits: uint16(peerSlots), seq: 1}
		},
		"sequence gap": func(int) frameHeader { return frameHeader{kind: frameCredit, seq: 7} },
		"second FIN":   func(int) frameHeader { return frameHeader{kind: frameFin, seq: 1} },
	} {
		t.Run(name, func(t *testing.T) {
			_, b, w := fakePair(t, fakeOpts{})
			e := w.ends[1]
			injectRecv(t, e, 0, frameHeader{kind: frameFin}.imm(), false)
			injectRecv(t, e, 0, bad(b.peerSlots).imm(), false)
			var logged []any
			b.log = func(msg string, args ...any) { logged = append(logged, args...) }
			b.peerGone("test: the peer closed")
			_, err := b.Recv(ctxT(t), make([]byte, 64))
			require.ErrorIs(t, err, io.EOF, "the FIN came first")
			require.EqualValues(t, 1, b.Stats().Errors, "the frame after the FIN broke the protocol")
			b.mu.Lock()
			require.ErrorIs(t, b.err, ErrProtocol)
			b.mu.Unlock()
			require.NotEmpty(t, logged, "the protocol error is logged")
			closesPromptly(t, b)
		})
	}
}
