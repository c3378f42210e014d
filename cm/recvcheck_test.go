package cm

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// injectRecv completes e's oldest posted receive as the device would for
// what the peer did: a send of n bytes, or (written) an RDMA write with
// immediate data of n bytes, which consumes a receive but fills none.
func injectRecv(t *testing.T, e *fakeEnd, n int, imm uint32, written bool) {
	t.Helper()
	e.w.mu.Lock()
	defer e.w.mu.Unlock()
	require.NotEmpty(t, e.posted, "no receive posted")
	r := e.posted[0]
	e.posted = append(e.posted[:0], e.posted[1:]...)
	e.cq = append(e.cq, completion{op: compRecv, slot: r, n: n, imm: imm, hasImm: true, written: written})
	e.signal()
}

// closesPromptly: Close after a protocol failure must not hang (a Recv that
// panicked with the connection's I/O lock held used to leave it so).
func closesPromptly(t *testing.T, c *Conn) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- c.Close() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close hung")
	}
}

// The lengths and kinds of receive completions come from the peer: a
// completion longer than its buffer, or one of an RDMA write with
// immediate data (which reports the write's length, and leaves in the
// buffer whatever an earlier connection put there), is the peer's
// doing. Raw peers may notify with such a write; framed ones never do.
func TestConnRecvCompletionFromPeerChecked(t *testing.T) {
	ctx := ctxT(t)
	t.Run("raw-longer-than-buffer", func(t *testing.T) {
		_, b, w := fakePair(t, fakeOpts{raw: true})
		injectRecv(t, w.ends[1], 1<<20, 0, false)
		var err error
		require.NotPanics(t, func() { _, err = b.Recv(ctx, make([]byte, 1<<21)) })
		require.ErrorIs(t, err, ErrProtocol)
		var oe *OpError
		require.ErrorAs(t, err, &oe)
		require.EqualValues(t, 1, b.Stats().Errors)
		closesPromptly(t, b)
	})
	t.Run("raw-write-with-imm", func(t *testing.T) {
		_, b, w := fakePair(t, fakeOpts{raw: true})
		copy(w.ends[1].recvBufs[0], "stale bytes of an earlier connection")
		injectRecv(t, w.ends[1], 1<<20, 7, true)
		n, imm, ok, err := b.RecvWithImm(ctx, make([]byte, 64))
		require.NoError(t, err)
		require.Zero(t, n, "the written data is in the peer's region, not the receive buffer")
		require.True(t, ok)
		require.EqualValues(t, 7, imm)
		closesPromptly(t, b)
	})
	t.Run("framed-write-with-imm", func(t *testing.T) {
		_, b, w := fakePair(t, fakeOpts{})
		injectRecv(t, w.ends[1], 16, 0, true)
		_, err := b.Recv(ctx, make([]byte, 256))
		require.ErrorIs(t, err, ErrProtocol)
		require.False(t, errors.Is(err, ErrClosed))
		require.EqualValues(t, 1, b.Stats().Errors)
		closesPromptly(t, b)
	})
}

// One-sided operations fail with errors callers can match.
func TestConnOneSidedErrorsTyped(t *testing.T) {
	a, b, _ := fakePair(t, fakeOpts{})
	ctx := ctxT(t)
	remote, err := b.RegisterMemory(64, RemoteRead|RemoteWrite)
	require.NoError(t, err)
	defer remote.Close()
	local, err := a.RegisterMemory(64, 0)
	require.NoError(t, err)
	require.NoError(t, local.Close())
	err = a.WriteRemote(ctx, local, 0, 8, remote.Descriptor(), 0)
	require.ErrorIs(t, err, ErrClosed, "a closed local region")
	require.ErrorContains(t, err, "local region")
	var oe *OpError
	require.ErrorAs(t, a.ReadRemote(ctx, nil, 0, 8, remote.Descriptor(), 0), &oe, "no local region")
	require.ErrorIs(t, oe, ErrInvalid, "no local region")
	_, err = a.RegisterMemory(0, 0)
	require.ErrorIs(t, err, ErrInvalid, "an empty region")
	open, err := a.RegisterMemory(64, 0)
	require.NoError(t, err)
	defer open.Close()
	for name, call := range map[string]func() error{
		"local range":  func() error { return a.WriteRemote(ctx, open, 60, 8, remote.Descriptor(), 0) },
		"remote range": func() error { return a.ReadRemote(ctx, open, 0, 8, remote.Descriptor(), 60) },
		"wrapping": func() error {
			d := remote.Descriptor()
			d.Addr = math.MaxUint64 - 4
			return a.ReadRemote(ctx, open, 0, 8, d, 0)
		},
	} {
		err := call()
		require.ErrorIs(t, err, ErrInvalid, name)
		require.False(t, errors.Is(err, ErrPeerGone), "%s: the connection stays up", name)
	}
	require.NoError(t, a.Send(ctx, []byte("still up")))
}
