package cm

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Send after Close returns ErrClosed, or the failure that broke the
// connection before (Close's doc), and after CloseWrite ErrClosed
// (CloseWrite's doc), whatever the message: one over MaxMessageSize said
// ErrMessageTooLong, and over XRC a SendWithImm said ErrNotSupported, as on
// an open connection, so a sender that checks for ErrClosed to stop took a
// closed connection for a bad message. On an open connection both still get
// their own errors.
func TestSendAfterCloseSaysClosedWhateverTheMessage(t *testing.T) {
	for _, tr := range parityTransports {
		t.Run(tr.name, func(t *testing.T) {
			p := tr.pair(t)
			tooLong := make([]byte, p.a.MaxMessageSize()+1)
			require.ErrorIs(t, p.a.Send(p.ctx, tooLong), ErrMessageTooLong, "open")
			if tr.name == "XRC" {
				require.ErrorIs(t, p.a.SendWithImm(p.ctx, []byte("x"), 7), ErrNotSupported, "open")
			}
			require.NoError(t, p.a.Close())
			require.ErrorIs(t, p.a.Send(p.ctx, tooLong), ErrClosed, "a message over the limit after Close")
			require.ErrorIs(t, p.a.SendWithImm(p.ctx, tooLong, 7), ErrClosed, "SendWithImm over the limit after Close")
			require.ErrorIs(t, p.a.SendWithImm(p.ctx, []byte("x"), 7), ErrClosed, "SendWithImm after Close")
		})
		t.Run(tr.name+"/CloseWrite", func(t *testing.T) {
			p := tr.pair(t)
			require.NoError(t, p.a.CloseWrite())
			tooLong := make([]byte, p.a.MaxMessageSize()+1)
			require.ErrorIs(t, p.a.Send(p.ctx, []byte("x")), ErrClosed, "setup: a message that fits")
			require.ErrorIs(t, p.a.Send(p.ctx, tooLong), ErrClosed, "a message over the limit after CloseWrite")
			require.ErrorIs(t, p.a.SendWithImm(p.ctx, []byte("x"), 7), ErrClosed, "SendWithImm after CloseWrite")
			require.NoError(t, p.b.Send(p.ctx, tooLong[:p.b.MaxMessageSize()]), "the other direction goes on")
		})
		t.Run(tr.name+"/broken", func(t *testing.T) {
			p := tr.pair(t)
			p.kill()
			p.settle()
			var err error
			for range 100 {
				if err = p.a.Send(p.ctx, []byte("x")); err != nil {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			require.ErrorIs(t, err, ErrPeerGone, "setup: the peer's death")
			p.a.Close()
			tooLong := make([]byte, p.a.MaxMessageSize()+1)
			require.ErrorIs(t, p.a.Send(p.ctx, tooLong), ErrPeerGone, "the failure before Close, as for a message that fits")
			require.ErrorIs(t, p.a.SendWithImm(p.ctx, []byte("x"), 7), ErrPeerGone, "the failure before Close")
		})
	}
}
