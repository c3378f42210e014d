package cm

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/xrc"
)

// A connection whose own process is killed (memfabric's Kill) was not
// closed by the application: its calls do not say ErrClosed (returned by
// operations on a closed Conn or Listener) but that the connection was lost
// (ErrPeerGone) because the process died (xrc.ErrProcessDied), which
// Stats.Errors counts.
func TestXRCOwnProcessKilledIsNoClose(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	f := newFabric(t)
	srv, cli := f.Node("10.1.0.1").Process(), f.Node("10.1.0.2").Process()
	l, err := Listen(ctx, "10.1.0.1:0", WithFabric(srv), WithDomainPath(t.TempDir()+"/xrc"))
	require.NoError(t, err)
	defer l.Close()
	c, s := fabricPair(ctx, t, srv, cli, nil, nil)
	cli.Kill()
	_, err = c.Recv(ctx, make([]byte, 64))
	require.NotErrorIs(t, err, ErrClosed, "the application closed nothing")
	require.ErrorIs(t, err, ErrPeerGone)
	require.ErrorIs(t, err, xrc.ErrProcessDied)
	err = c.Send(ctx, []byte("x"))
	require.NotErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, err, xrc.ErrProcessDied)
	require.Equal(t, uint64(1), c.Stats().Errors)
	srv.Kill()
	// A listener whose endpoint died is closed for good, and says so as a
	// failed RC listener does: ErrClosed, the cause in words
	// (xrcAcceptErr).
	_, err = l.Accept(ctx)
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorContains(t, err, xrc.ErrProcessDied.Error())
	_, err = s.Recv(ctx, make([]byte, 64))
	require.NotErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, err, xrc.ErrProcessDied)
}
