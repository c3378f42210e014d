package cm

import (
	"errors"
	"net"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/xrc"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// ErrInvalid is matched by the error of a call given an option or argument
// it cannot take (its doc, and the package doc's "Errors and waiting"), as
// an address that does not parse, a queue depth out of range or WithFabric
// with WithXRC(XRCOff) are. Three refusals did not match it: DialContext's
// network that is none of "tcp", "tcp4", "tcp6" and "rdma"; a network whose
// family contradicts WithLocalAddr's address; and WithFabric of a Process
// that no memfabric Node made. Each keeps the error it had besides
// (net.UnknownNetworkError, *net.AddrError, xrc.ErrNoKernel) and is still
// an *OpError.
func TestRefusedArgumentsMatchErrInvalid(t *testing.T) {
	ctx := ctxT(t)
	f := newFabric(t)
	client := f.Node("10.1.0.2").Process()
	dom := WithDomainPath(filepath.Join(t.TempDir(), "xrc"))
	isInvalid := func(what string, err error) {
		t.Helper()
		var oe *OpError
		require.ErrorAs(t, err, &oe, what)
		require.ErrorIs(t, err, ErrInvalid, "%s: %v", what, err)
	}

	d := &Dialer{Options: []Option{WithFabric(client), dom}}
	_, err := d.DialContext(ctx, "udp", "10.1.0.1:7471")
	isInvalid("unknown network", err)
	require.ErrorAs(t, err, new(net.UnknownNetworkError))

	d = &Dialer{Options: []Option{WithFabric(client), dom, WithLocalAddr("10.1.0.2")}}
	_, err = d.DialContext(ctx, "tcp6", "10.1.0.1:7471")
	isInvalid("tcp6 from an IPv4 local address", err)
	var ae *net.AddrError
	require.ErrorAs(t, err, &ae)
	require.Equal(t, "mismatched local address type", ae.Err)

	zero := &memfabric.Process{}
	_, err = Dial(ctx, "10.1.0.1:7471", WithFabric(zero), dom)
	isInvalid("Dial on a zero Process", err)
	require.ErrorIs(t, err, xrc.ErrNoKernel)
	_, err = Listen(ctx, "10.1.0.1:7471", WithFabric(zero), dom)
	isInvalid("Listen on a zero Process", err)
	require.ErrorIs(t, err, xrc.ErrNoKernel)

	// What the call can take but the network refuses is no argument
	// error: a literal of the other family, as net.Dial says.
	_, err = d.DialContext(ctx, "tcp", "[fd00::1]:7471")
	require.False(t, errors.Is(err, ErrInvalid), "%v", err)
}
