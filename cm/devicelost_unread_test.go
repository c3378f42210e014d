package cm

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// A device lost with messages come and not yet read: Recv still gives
// them, then io.EOF after the peer's end (its CloseWrite, its Close), or
// the loss (ErrPeerGone) without one, as over XRC, whose engine holds what
// it took in. RC said ErrPeerGone at once: its release gave the receive
// buffers back with the device, also those of messages taken in, and what
// was still in the CQ was never polled; the senders had their completions
// (a Close that returned nil), and the messages were lost.
func TestDeviceLostKeepsUnreadMessages(t *testing.T) {
	ends := []struct {
		name string
		end  func(*Conn) error
		want string
	}{
		{"none", func(*Conn) error { return nil }, "peer gone"},
		{"CloseWrite", (*Conn).CloseWrite, "EOF"},
		{"Close", (*Conn).Close, "EOF"},
	}
	for _, e := range ends {
		for _, tr := range parityTransports {
			t.Run(e.name+"/"+tr.name, func(t *testing.T) {
				p := tr.pair(t)
				// a's side must have taken b's frames in (XRC's engine
				// on its own, at a moment of its choosing): a Send
				// waiting for the credits that b's reads return after
				// them, on the same leg; after b's Close, settle.
				var sent <-chan error
				if e.name != "Close" {
					sent = blockedSend(t, p)
				}
				for i := range 3 {
					require.NoError(t, p.b.Send(p.ctx, []byte(fmt.Sprint("message ", i))))
				}
				require.NoError(t, e.end(p.b))
				if sent != nil {
					buf := make([]byte, 64)
					for range parityDepth {
						_, err := p.b.Recv(p.ctx, buf)
						require.NoError(t, err)
					}
					require.NoError(t, <-sent)
				} else {
					p.settle()
				}
				p.loseA()
				buf := make([]byte, 64)
				var got []string
				for {
					n, err := p.a.Recv(p.ctx, buf)
					if err != nil {
						got = append(got, errClass(err))
						break
					}
					got = append(got, string(buf[:n]))
				}
				require.Equal(t, []string{"message 0", "message 1", "message 2", e.want}, got)
				require.Equal(t, uint64(3), p.a.Stats().MessagesReceived)
				_, err := p.a.Recv(p.ctx, buf)
				require.Equal(t, e.want, errClass(err), "again")
			})
		}
	}
}

// Our Close after a device loss drops the messages still unread: Recv
// says the failure that broke the connection, as Close's doc has it.
func TestDeviceLostThenCloseDropsUnread(t *testing.T) {
	for _, tr := range parityTransports {
		t.Run(tr.name, func(t *testing.T) {
			p := tr.pair(t)
			for range 2 {
				require.NoError(t, p.b.Send(p.ctx, []byte("unread")))
			}
			buf := make([]byte, 64)
			_, err := p.a.Recv(p.ctx, buf)
			require.NoError(t, err)
			p.loseA()
			require.NoError(t, p.a.Close())
			_, err = p.a.Recv(p.ctx, buf)
			require.Equal(t, "peer gone", errClass(err))
		})
	}
}
