package cm

import (
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/verbs"
)

// vanishOn is a fake end whose peer stops answering just as our next frame
// of kind goes out: its completion is RETRY_EXC_ERR and the CM reports no
// disconnect (a node that lost power).
type vanishOn struct {
	*fakeEnd
	kind frameKind
}

func (e vanishOn) postSend(slot, n int, imm uint32, hasImm, signaled bool) error {
	if hasImm && frameKind(imm>>30) == e.kind {
		e.w.mu.Lock()
		e.cq = append(e.cq, completion{op: compSend, slot: slot, err: &verbs.CompletionError{Status: verbs.WCRetryExcErr}})
		e.signal()
		e.w.mu.Unlock()
		return nil
	}
	return e.fakeEnd.postSend(slot, n, imm, hasImm, signaled)
}

// Close decided whether the peer vanished before its FIN and drain only: a
// peer found vanished by the FIN itself was released as if it would answer
// the DREQ, and the release waited for a time-wait (bounded by the
// handshake timeout) from a peer that was not there.
func TestConnCloseVanishedDuringFin(t *testing.T) {
	a, _, w := fakePair(t, fakeOpts{})
	a.t = vanishOn{w.ends[0], frameFin}
	require.NoError(t, a.Close())
	w.mu.Lock()
	defer w.mu.Unlock()
	require.True(t, w.ends[0].releasedVanished, "the FIN's RETRY_EXC_ERR showed the peer vanished, release was told otherwise")
}

// A peer that half-closed (CloseWrite: its request is complete) and then
// vanished while we sent the response: our data frame failed with
// RETRY_EXC_ERR. failLocked took every failure after the peer's FIN for the
// orderly end, so the lost response was neither counted nor logged, though
// Stats.Errors counts "a request failed" / "the peer vanished".
func TestStatsFailureAfterPeerHalfCloseCounted(t *testing.T) {
	a, b, w := fakePair(t, fakeOpts{})
	var logged []string
	a.log = func(msg string, _ ...any) { logged = append(logged, msg) }
	ctx := ctxT(t)
	require.NoError(t, b.CloseWrite())
	_, err := a.Recv(ctx, make([]byte, 64))
	require.ErrorIs(t, err, io.EOF)
	a.t = vanishOn{w.ends[0], frameData}
	require.NoError(t, a.Send(ctx, []byte("response"))) // posted
	err = a.Send(ctx, []byte("more"))
	for err == nil {
		err = a.Send(ctx, []byte("more"))
	}
	require.ErrorIs(t, err, ErrPeerGone)
	require.Equal(t, uint64(1), a.Stats().Errors, "the response was lost: the peer vanished")
	require.Equal(t, []string{"connection failed"}, logged)
}

// Data after the peer's FIN counts one error (handle counts it; failLocked
// must not count it again).
func TestStatsDataAfterFinCountedOnce(t *testing.T) {
	a, b, _ := fakePair(t, fakeOpts{})
	ctx := ctxT(t)
	require.NoError(t, a.CloseWrite())
	a.mu.Lock()
	a.writeClosed = false
	a.mu.Unlock()
	require.NoError(t, a.Send(ctx, []byte("after")))
	_, err := b.Recv(ctx, make([]byte, 64))
	require.ErrorIs(t, err, io.EOF)
	require.Eventually(t, func() bool { return b.Stats().Errors > 0 }, time.Second, time.Millisecond)
	time.Sleep(10 * time.Millisecond)
	require.Equal(t, uint64(1), b.Stats().Errors)
}
