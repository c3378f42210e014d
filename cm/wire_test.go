package cm

import (
	"errors"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A data frame after the peer's FIN breaks the protocol (CloseWrite: "Send
// fails with ErrClosed from then on"); it must not reach the application,
// least of all after io.EOF.
func TestConnDataAfterFinRefused(t *testing.T) {
	a, b, _ := fakePair(t, fakeOpts{})
	ctx := ctxT(t)
	require.NoError(t, a.Send(ctx, []byte("before")))
	require.NoError(t, a.CloseWrite())
	// A misbehaving peer sends data after its FIN.
	a.mu.Lock()
	a.writeClosed = false
	a.mu.Unlock()
	require.NoError(t, a.Send(ctx, []byte("after")))
	time.Sleep(20 * time.Millisecond) // let everything land

	buf := make([]byte, 64)
	n, err := b.Recv(ctx, buf)
	require.NoError(t, err)
	require.Equal(t, "before", string(buf[:n]))
	for i := 0; i < 3; i++ {
		n, err = b.Recv(ctx, buf)
		if err != nil {
			if errors.Is(err, io.EOF) {
				continue // then look again: data must not follow
			}
			require.ErrorIs(t, err, ErrProtocol)
			return
		}
		t.Fatalf("Recv %d after the peer's FIN returned data %q", i, buf[:n])
	}
}

// The header's sequence number is 16 bits: a long-lived connection wraps
// it. Start both directions just below the wrap and cross it.
func TestConnSequenceWraps(t *testing.T) {
	for _, depth := range []int{2, 8} {
		a, b, _ := fakePair(t, fakeOpts{depth: [2]int{depth, depth}})
		for _, c := range []*Conn{a, b} {
			c.mu.Lock()
			c.sendSeq, c.recvSeq = 0xfff0, 0xfff0
			c.mu.Unlock()
		}
		ctx := ctxT(t)
		errs := make(chan error, 3)
		go func() { errs <- echoN(ctx, b, 100, 256) }()
		go func() { errs <- sendN(ctx, a, 100) }()
		go func() { errs <- recvN(ctx, a, 100) }()
		for range 3 {
			require.NoError(t, <-errs)
		}
		a.mu.Lock()
		require.Less(t, a.sendSeq, uint16(0xfff0), "wrapped")
		a.mu.Unlock()
	}
}
