package cm

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// After our CloseWrite, Send says ErrClosed (CloseWrite's doc: "Send fails
// with ErrClosed from then on"), also once the peer's end or a failure
// came, as over XRC, whose engine answers a half-closed connection's Send
// so whatever came after. A device lost after the CloseWrite made RC's
// Send say ErrClosed until the Close that deviceLost starts in a goroutine
// had set closing, and ErrPeerGone from then on (closing with lostClose
// skipped the CloseWrite rule, and so did the released connection's
// path): the answer hung on the scheduler, and differed from XRC's.
func TestCloseWriteThenDeviceLostSendSaysClosed(t *testing.T) {
	got := map[string][]string{}
	for _, tr := range parityTransports {
		t.Run(tr.name, func(t *testing.T) {
			p := tr.pair(t)
			require.NoError(t, p.a.CloseWrite())
			require.ErrorIs(t, p.a.Send(p.ctx, []byte("x")), ErrClosed, "before the device loss")
			p.loseA()
			var l parityLog
			for range 3 {
				l.err("a.Send", p.a.Send(p.ctx, []byte("x")))
			}
			_, err := p.a.NetConn().Write([]byte("x"))
			l.err("a.Write", err)
			l.err("a.CloseWrite", p.a.CloseWrite())
			// The application's Close: the failure that broke the
			// connection before it, as Close's doc has it.
			l.err("a.Close", p.a.Close())
			l.err("a.Send after Close", p.a.Send(p.ctx, []byte("x")))
			got[tr.name] = l
			require.Equal(t, []string{
				"a.Send: closed", "a.Send: closed", "a.Send: closed", "a.Write: closed", "a.CloseWrite: nil",
				"a.Close: nil", "a.Send after Close: peer gone",
			}, []string(l))
		})
	}
	require.Equal(t, got["RC"], got["XRC"], "RC and XRC differ")
}
