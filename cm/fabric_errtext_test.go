package cm

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/xrc"
)

// An XRC connection's errors that this package maps onto its own sentinels
// say the meaning once. A Recv with a buffer too short for the message said
// "recv ADDR: message too long: xrc: message too long: 11-byte message,
// 2-byte buffer", where an RC connection says "message too long: 11-byte
// message, 2-byte buffer"; a protocol violation "protocol violation by peer:
// xrc: protocol violation by peer: ...". The errors still match both
// packages' sentinels.
func TestFabricMappedErrorsSayTheirMeaningOnce(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	f := newFabric(t)
	c, s := fabricPair(ctx, t, f.Node("10.1.0.1").Process(), f.Node("10.1.0.2").Process(), nil, nil)

	require.NoError(t, s.Send(ctx, []byte("hello world")))
	_, err := c.Recv(ctx, make([]byte, 2))
	require.EqualError(t, err, "recv "+c.RemoteAddr().String()+": message too long: 11-byte message, 2-byte buffer")
	require.ErrorIs(t, err, ErrMessageTooLong)
	require.ErrorIs(t, err, xrc.ErrMessageTooLong)

	for _, tc := range []struct {
		engine, want error
		text         string
	}{
		{fmt.Errorf("%w: messages sent past the receive window", xrc.ErrProtocol), ErrProtocol,
			"protocol violation by peer: messages sent past the receive window"},
		{fmt.Errorf("%w: silent past the idle timeout", xrc.ErrPeerGone), ErrPeerGone,
			"connection lost: silent past the idle timeout"},
		{&xrc.OpError{Op: "recv", Addr: "10.1.0.1:7000", Err: fmt.Errorf("%w: 11-byte message, 2-byte buffer", xrc.ErrMessageTooLong)}, ErrMessageTooLong,
			"message too long: 11-byte message, 2-byte buffer"},
	} {
		err := mapXRCErr(tc.engine)
		require.EqualError(t, err, tc.text)
		require.ErrorIs(t, err, tc.want)
		require.True(t, errors.Is(err, errors.Unwrap(tc.engine)) || errors.Is(err, tc.engine), "%v does not match the engine's error", err)
	}
}
