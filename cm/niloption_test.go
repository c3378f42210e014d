package cm

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// A nil Option (one an application picks by a condition, say) sets
// nothing; Listen and Dial panicked on it.
func TestNilOption(t *testing.T) {
	ctx := ctxT(t)
	f := newFabric(t)
	srv, cli := f.Node("10.1.0.1").Process(), f.Node("10.1.0.2").Process()
	t.Cleanup(srv.Kill)
	t.Cleanup(cli.Kill)
	l, err := Listen(ctx, "10.1.0.1:0", WithFabric(srv), nil, WithDomainPath(filepath.Join(t.TempDir(), "xrc")))
	require.NoError(t, err)
	defer l.Close()
	go func() {
		if c, err := l.Accept(ctx); err == nil {
			c.Close()
		}
	}()
	d := Dialer{Options: []Option{nil, WithFabric(cli), WithDomainPath(filepath.Join(t.TempDir(), "xrc"))}}
	c, err := d.Dial(ctx, l.Addr().String())
	require.NoError(t, err)
	require.NoError(t, c.Close())
}
