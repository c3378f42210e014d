package cm

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// WithFabric with WithXRC(XRCOff) fails with ErrInvalid, and with
// WithRawMessages with ErrNotSupported (WithFabric's doc): the options
// contradict each other, whatever the address. Both were checked only at
// the engine's configuration (xrcConfig), after the address was looked up,
// so a Dial or Listen on a host name that did not resolve (a DNS server
// down, a name not yet published) failed with the look-up's error, which
// matches neither, and one on a name that did resolve waited for the
// look-up before it was refused.
func TestFabricContradictoryOptionsRefusedBeforeLookup(t *testing.T) {
	ctx := ctxT(t)
	p := newFabric(t).Node("10.1.0.2").Process()
	var lookups atomic.Int32
	noDNS := &net.Resolver{PreferGo: true, Dial: func(context.Context, string, string) (net.Conn, error) {
		lookups.Add(1)
		return nil, errors.New("no DNS server here")
	}}
	for _, tc := range []struct {
		name string
		opt  Option
		want error
	}{
		{"WithXRC(XRCOff)", WithXRC(XRCOff), ErrInvalid},
		{"WithRawMessages", WithRawMessages(), ErrNotSupported},
	} {
		opts := []Option{WithFabric(p), WithDomainPath(filepath.Join(t.TempDir(), "d")), WithResolver(noDNS), tc.opt}
		_, err := Dial(ctx, "server.goxrc.test:7471", opts...)
		require.ErrorIs(t, err, tc.want, "Dial with WithFabric and %s: %v", tc.name, err)
		var oe *OpError
		require.ErrorAs(t, err, &oe, tc.name)
		_, err = Listen(ctx, "server.goxrc.test:7471", opts...)
		require.ErrorIs(t, err, tc.want, "Listen with WithFabric and %s: %v", tc.name, err)
		require.ErrorAs(t, err, &oe, tc.name)
	}
	require.Zero(t, lookups.Load(), "contradictory options are refused before any look-up")
}
