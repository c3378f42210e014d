package cm

import (
	"context"
	"errors"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A local address that is not the fabric node's is one this host does not
// hold: the error matches syscall.EADDRNOTAVAIL, as a Dial from it on a
// device does (TestCMDialFromLocalAddr), as a fabric Listen on it does, and
// as package net's bind says. It is the host's answer, not an argument no
// call could take: it is not ErrInvalid.
func TestFabricDialForeignLocalAddr(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	f := newFabric(t)
	server, client := f.Node("10.1.0.1"), f.Node("10.1.0.2")
	domain := func() Option { return WithDomainPath(filepath.Join(t.TempDir(), "xrc")) }
	l, err := Listen(ctx, "10.1.0.1:7471", WithFabric(server.Process()), domain())
	require.NoError(t, err)
	defer l.Close()

	_, err = Listen(ctx, "10.1.0.3:0", WithFabric(client.Process()), domain())
	require.ErrorIs(t, err, syscall.EADDRNOTAVAIL, "a fabric Listen on it")
	_, err = Dial(ctx, "10.1.0.1:7471", WithFabric(client.Process()), domain(), WithLocalAddr("10.1.0.3"))
	require.ErrorContains(t, err, "local address 10.1.0.3 is not the fabric node's (10.1.0.2)")
	require.ErrorIs(t, err, syscall.EADDRNOTAVAIL, "a fabric Dial from it")
	require.False(t, errors.Is(err, ErrInvalid), "%v", err)
}
