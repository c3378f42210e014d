package cm

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// A CloseWrite that returned nil stays so: a CloseWrite again returns nil,
// whatever came since (the peer's Close, its death after its FIN or
// without one, a device loss), until our own Close. It said ErrPeerGone on
// XRC after the peer's end, and on RC nil or ErrPeerGone by whether the
// Conn had taken the peer's disconnect in (TestEndParityRandom took
// either).
func TestCloseWriteAgainAfterPeerEnd(t *testing.T) {
	cases := []struct {
		name string
		then func(t *testing.T, p *parityPair)
		want string
	}{
		{"peer closes", func(t *testing.T, p *parityPair) {
			require.NoError(t, p.b.Close())
			_, err := p.a.Recv(p.ctx, make([]byte, 64))
			require.Equal(t, "EOF", errClass(err))
		}, "nil"},
		{"peer half-closes and dies", func(t *testing.T, p *parityPair) {
			require.NoError(t, p.b.CloseWrite())
			_, err := p.a.Recv(p.ctx, make([]byte, 64))
			require.Equal(t, "EOF", errClass(err))
			p.kill()
			p.settle()
		}, "nil"},
		{"peer dies", func(t *testing.T, p *parityPair) {
			p.kill()
			p.settle()
			_, err := p.a.Recv(p.ctx, make([]byte, 64))
			require.Equal(t, "peer gone", errClass(err))
		}, "nil"},
		{"device lost", func(t *testing.T, p *parityPair) { p.loseA() }, "nil"},
		{"own Close", func(t *testing.T, p *parityPair) { require.NoError(t, p.a.Close()) }, "closed"},
	}
	for _, tc := range cases {
		for _, tr := range parityTransports {
			t.Run(tc.name+"/"+tr.name, func(t *testing.T) {
				p := tr.pair(t)
				require.NoError(t, p.a.CloseWrite())
				_, err := p.b.Recv(p.ctx, make([]byte, 64))
				require.Equal(t, "EOF", errClass(err))
				tc.then(t, p)
				require.Equal(t, tc.want, errClass(p.a.CloseWrite()))
			})
		}
	}
}

// A first CloseWrite after the peer died says ErrPeerGone on both, also
// before a poll took the death in: RC posted its FIN into the flushed QP
// and said nil where the CM had reported the disconnect already (XRC's
// engine said ErrPeerGone).
func TestCloseWriteFirstAfterPeerDeath(t *testing.T) {
	for _, tr := range parityTransports {
		t.Run(tr.name, func(t *testing.T) {
			p := tr.pair(t)
			p.kill()
			// Heard of: before, the half-close goes and CloseWrite
			// says nil (its doc), over XRC once its FIN is posted.
			p.settle()
			require.Equal(t, "peer gone", errClass(p.a.CloseWrite()))
			require.Equal(t, "peer gone", errClass(p.a.CloseWrite()), "again")
		})
	}
}
