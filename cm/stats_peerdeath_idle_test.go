package cm

import (
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The peer died, and the application calls nothing: once the transport has
// taken the death in (RC: the CM's disconnect; XRC: the engine's verdict,
// settle), Stats counts the failure. RC counted it only at the
// application's next call, which polled the flush: an idle connection
// said 0 for good, where XRC said 1 (found by a probe of TestEndParity's
// pairs).
func TestStatsPeerDeathCountedWithoutCalls(t *testing.T) {
	for _, tr := range parityTransports {
		t.Run(tr.name, func(t *testing.T) {
			p := tr.pair(t)
			p.kill()
			p.settle()
			require.Equal(t, uint64(1), p.a.Stats().Errors, "the peer died without its FIN")
			// And the calls after say what they said before.
			var l parityLog
			l.calls(p, "a", p.a)
			require.Equal(t, []string{
				"a.Send: peer gone", "a.Recv: peer gone", "a.CloseWrite: peer gone", "a.Close: nil", "a.Errors: 1",
			}, []string(l))
		})
	}
}

// The peer sent, ended its stream and then its process died, and the
// application calls nothing: no failure, whether or not the transport took
// the flush in by itself, and every message is read, then io.EOF.
func TestStatsPeerFinThenDeathWithoutCallsNotAnError(t *testing.T) {
	for _, tr := range parityTransports {
		t.Run(tr.name, func(t *testing.T) {
			p := tr.pair(t)
			require.NoError(t, p.b.Send(p.ctx, []byte("last words")))
			require.NoError(t, p.b.CloseWrite())
			p.kill()
			p.settle()
			require.Zero(t, p.a.Stats().Errors)
			var l parityLog
			buf := make([]byte, 64)
			n, err := p.a.Recv(p.ctx, buf)
			require.NoError(t, err)
			require.Equal(t, "last words", string(buf[:n]))
			l.recvAll(p, "a", p.a)
			l.errors("a", p.a)
			require.Equal(t, []string{"a.Recv: EOF", "a.Errors: 0"}, []string(l))
		})
	}
}

// The same over XRC, with the engine's timers such that its verdict on the
// DREQ of the dead peer's INI (half an idle timeout after it) falls due in
// the same look of its janitor as the keepalive whose failure tells of the
// death too: the verdict, taken first, said the peer was silent
// (ErrPeerGone: Errors 1); the keepalive's failure, where it came first
// (the default timers, mostly), said nothing. The flaky
// TestStatsPeerFinThenDeathWithoutCallsNotAnError/XRC failed so under
// load.
func TestStatsPeerFinThenDeathNotAnErrorWhicheverXRCVerdictFirst(t *testing.T) {
	p := xrcParityPairWith(t, func(c *config) { c.xrcHeartbeat, c.xrcIdle = 100*time.Millisecond, 200*time.Millisecond })
	require.NoError(t, p.b.Send(p.ctx, []byte("last words")))
	require.NoError(t, p.b.CloseWrite())
	p.kill()
	p.settle()
	require.Zero(t, p.a.Stats().Errors)
	buf := make([]byte, 64)
	n, err := p.a.Recv(p.ctx, buf)
	require.NoError(t, err)
	require.Equal(t, "last words", string(buf[:n]))
	_, err = p.a.Recv(p.ctx, buf)
	require.ErrorIs(t, err, io.EOF)
	require.Zero(t, p.a.Stats().Errors)
}
