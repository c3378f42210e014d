package cm

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The peer's process died; our Send found its endpoint gone, and we closed
// at once. Over RC that death counts in Stats.Errors (the disconnect came
// with no FIN before it). Over XRC the Send's failure is provisional (the
// peer's FIN may sit unread in our SRQ) and the receive loop decides at its
// next poll, but Close came first: it set closedUp with no FIN sent, and
// xrc.Conn.Err excused the failure that followed (shared endpoint); or the
// endpoint, closed with its last connection, failed it ErrClosed first
// (alone). Either way, Stats said 0.
func TestStatsPeerDiesSendFailsThenCloseCounted(t *testing.T) {
	t.Run("RC", func(t *testing.T) {
		a, _, w := fakePair(t, fakeOpts{})
		ctx := ctxT(t)
		w.ends[1].shutdown()
		a.peerGone("peer disconnected")
		sendUntilFails(ctx, t, a)
		require.NoError(t, a.Close())
		require.Equal(t, uint64(1), a.Stats().Errors)
	})
	for _, shared := range []bool{false, true} {
		t.Run(map[bool]string{false: "XRC alone", true: "XRC shared endpoint"}[shared], func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			f := newFabric(t)
			srv, cli := f.Node("10.1.0.1").Process(), f.Node("10.1.0.2").Process()
			opts := []Option{WithDomainPath(filepath.Join(t.TempDir(), "xrc"))}
			a, _ := fabricPair(ctx, t, srv, cli, nil, opts)
			if shared {
				// Another connection keeps the dialer's endpoint open.
				fabricPair(ctx, t, f.Node("10.1.0.3").Process(), cli, nil, opts)
			}
			ep := endpointOf(t, cli)
			srv.Kill()
			sendUntilFails(ctx, t, a)
			require.NoError(t, a.Close())
			if shared {
				// The engine is done with it once only the other is left.
				awaitConns(t, ep, 1, 10*time.Second)
			}
			require.Equal(t, uint64(1), a.Stats().Errors, "the peer died without its FIN, as over RC")
		})
	}
}

func sendUntilFails(ctx context.Context, t *testing.T, c *Conn) {
	t.Helper()
	var err error
	for err == nil {
		err = c.Send(ctx, []byte("to the dead"))
	}
	require.ErrorIs(t, err, ErrPeerGone)
}

// The peer's process died, and we closed before anything told us. Over RC
// Close's FIN and drain fail, a failure Stats counts (with or without the
// CM's word of the disconnect first). Over XRC our FIN was flushed on the
// INI the death failed, and the recovery's MOVE refused NO_LISTENER, which
// the engine took for the receiver's answer to our FIN: Close set closedUp,
// the endpoint's Close then said ErrClosed, and Stats counted nothing.
func TestStatsPeerDiesThenCloseCounted(t *testing.T) {
	for _, tr := range []struct {
		name string
		pair func(*testing.T) *parityPair
	}{{"RC", rcParityPair}, {"XRC", xrcParityPair}} {
		t.Run(tr.name, func(t *testing.T) {
			p := tr.pair(t)
			p.kill()
			require.NoError(t, p.a.Close())
			require.Equal(t, uint64(1), p.a.Stats().Errors, "the peer died without its FIN")
		})
	}
}
