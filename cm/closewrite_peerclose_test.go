package cm

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A first CloseWrite right after the peer's Close, nothing read: its answer
// depends on whether this side has heard of the close yet, which nothing
// in the API orders (the peer's Close returns once its FIN is posted, not
// once we have it; on RC the CM's word of the disconnect comes on a
// goroutine of its own, on XRC the FIN on the engine's receive loop). Both
// answers are right, on both transports: not heard, the half-close goes
// (nil), as a TCP shutdown(SHUT_WR) after the peer's close does; heard,
// ErrPeerGone, as Send says then (CloseWrite's doc). Either way the
// connection ends alike after: Recv reads io.EOF, no error counts, and a
// CloseWrite again says what the first did. Each order is forced here:
// holdA keeps the word from a, settle waits until it has it.
func TestCloseWriteFirstAfterPeerClose(t *testing.T) {
	cases := []struct {
		name string
		run  func(p *parityPair, l *parityLog)
		want []string
	}{
		{"not heard yet", func(p *parityPair, l *parityLog) {
			release := p.holdA()
			l.err("b.Close", p.b.Close())
			l.err("a.CloseWrite", p.a.CloseWrite())
			release()
		}, []string{"b.Close: nil", "a.CloseWrite: nil",
			"a.Recv: EOF", "a.Send: closed", "a.Recv: EOF", "a.CloseWrite: nil", "a.Close: nil", "a.Errors: 0"}},
		{"heard", func(p *parityPair, l *parityLog) {
			l.err("b.Close", p.b.Close())
			p.settle()
			l.err("a.CloseWrite", p.a.CloseWrite())
		}, []string{"b.Close: nil", "a.CloseWrite: peer gone",
			"a.Recv: EOF", "a.Send: peer gone", "a.Recv: EOF", "a.CloseWrite: peer gone", "a.Close: nil", "a.Errors: 0"}},
	}
	for _, tc := range cases {
		for _, tr := range parityTransports {
			t.Run(tc.name+"/"+tr.name, func(t *testing.T) {
				p := tr.pair(t)
				var l parityLog
				tc.run(p, &l)
				l.recvAll(p, "a", p.a)
				l.calls(p, "a", p.a)
				require.Equal(t, tc.want, []string(l))
				require.Zero(t, p.b.Stats().Errors)
			})
		}
	}
}
