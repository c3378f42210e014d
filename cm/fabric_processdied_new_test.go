package cm

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/xrc"
)

// A Dial or Listen on a process that was killed is no call on a closed
// Conn or Listener: it says that the process died (xrc.ErrProcessDied),
// not ErrClosed. Once the process's dialer endpoint had seen the kill, a
// Dial opened a new endpoint on the dead process, and said "use of closed
// network connection", where a Dial before it, on the old endpoint, said
// that the process died.
func TestXRCDialOnKilledProcessIsNoClose(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	f := newFabric(t)
	srv, cli := f.Node("10.1.0.1").Process(), f.Node("10.1.0.2").Process()
	dom := filepath.Join(t.TempDir(), "xrc")
	c, _ := fabricPair(ctx, t, srv, cli, nil, []Option{WithDomainPath(dom)})
	cli.Kill()
	_, err := c.Recv(ctx, make([]byte, 64)) // the dialer endpoint has seen it
	require.ErrorIs(t, err, xrc.ErrProcessDied)
	_, err = Dial(ctx, c.RemoteAddr().String(), WithFabric(cli), WithDomainPath(dom))
	require.Error(t, err)
	require.NotErrorIs(t, err, ErrClosed, "the application closed nothing")
	require.ErrorIs(t, err, xrc.ErrProcessDied)
	_, err = Listen(ctx, "10.1.0.2:0", WithFabric(cli), WithDomainPath(dom))
	require.Error(t, err)
	require.NotErrorIs(t, err, ErrClosed, "the application closed nothing")
	require.ErrorIs(t, err, xrc.ErrProcessDied)
}
