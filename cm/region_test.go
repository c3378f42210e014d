package cm

import (
	"bytes"
	"context"
	"errors"
	"math"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRemoteRegionRejectsHostileDescriptors(t *testing.T) {
	ok := RemoteRegion{Addr: 0x7f00_0000_1000, Len: 8192, RKey: 0x1234}
	got, err := UnmarshalRemoteRegion(ok.Marshal())
	require.NoError(t, err)
	require.Equal(t, ok, got)

	for _, b := range [][]byte{nil, make([]byte, RemoteRegionLen-1), make([]byte, RemoteRegionLen+1)} {
		_, err := UnmarshalRemoteRegion(b)
		require.ErrorIs(t, err, ErrProtocol, "%d bytes", len(b))
	}
	edge := RemoteRegion{Addr: math.MaxUint64 - 100, Len: 100}
	_, err = UnmarshalRemoteRegion(edge.Marshal())
	require.NoError(t, err, "a region ending at the top of the address space")
	edge.Len++
	_, err = UnmarshalRemoteRegion(edge.Marshal())
	require.ErrorContains(t, err, "wraps")
	require.ErrorIs(t, err, ErrProtocol)
}

// FuzzUnmarshalRemoteRegion: a descriptor from a peer either fails to
// decode or decodes to a region that does not wrap and marshals back to
// the same bytes.
func FuzzUnmarshalRemoteRegion(f *testing.F) {
	f.Add(RemoteRegion{Addr: 0x7f00_0000_1000, Len: 8192, RKey: 7}.Marshal())
	f.Add(RemoteRegion{Addr: math.MaxUint64, Len: 1}.Marshal())
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := UnmarshalRemoteRegion(b)
		if err != nil {
			return
		}
		if r.Addr+uint64(r.Len) < r.Addr {
			t.Fatalf("%+v wraps", r)
		}
		if !bytes.Equal(r.Marshal(), b) {
			t.Fatalf("%x decodes to %+v, which marshals to %x", b, r, r.Marshal())
		}
	})
}

// stallRDMA never completes one-sided operations, so the caller's context
// ends first.
type stallRDMA struct{ *fakeEnd }

func (stallRDMA) postRDMA(bool, *Region, int, int, RemoteRegion, uint64) error { return nil }

// A one-sided operation abandoned at its deadline breaks the connection
// (the device may still use local memory), and every later call says the
// connection is lost, not that it timed out: a caller that retries on
// Timeout() would retry a dead connection for ever, and the net.Conn adapter
// reported "i/o timeout" with no deadline set.
func TestAbandonedRDMAIsNotATimeoutLater(t *testing.T) {
	a, b, w := fakePair(t, fakeOpts{})
	a.t = stallRDMA{w.ends[0]}
	remote, err := b.RegisterMemory(4096, true)
	require.NoError(t, err)
	defer remote.Close()
	local, err := a.RegisterMemory(4096, false)
	require.NoError(t, err)
	defer local.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, a.WriteRemote(ctx, local, 0, 8, remote.Descriptor(), 0), context.DeadlineExceeded)

	_, err = a.Recv(context.Background(), make([]byte, 256))
	require.ErrorIs(t, err, ErrPeerGone)
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	require.False(t, ne.Timeout(), "Recv after the abandoned write: %v", err)
	require.False(t, errors.Is(err, context.DeadlineExceeded), "Recv after the abandoned write: %v", err)
	nc := a.NetConn()
	_, err = nc.Read(make([]byte, 16))
	require.ErrorIs(t, err, ErrPeerGone)
	require.False(t, errors.Is(err, os.ErrDeadlineExceeded), "Read with no deadline: %v", err)
	_, err = nc.Write([]byte("x"))
	require.ErrorIs(t, err, ErrPeerGone)
	require.False(t, errors.Is(err, os.ErrDeadlineExceeded), "Write with no deadline: %v", err)
}

// heldRDMA completes its one-sided request late,
// as a device finishes a transfer some time after its post: once finish is closed.
type heldRDMA struct {
	*fakeEnd
	posted, finish chan struct{}
}

func (h heldRDMA) postRDMA(write bool, local *Region, off, n int, remote RemoteRegion, roff uint64) error {
	close(h.posted)
	go func() {
		<-h.finish
		h.fakeEnd.postRDMA(write, local, off, n, remote, roff)
	}()
	return nil
}

// Closing a Region waits for an operation on it that is in flight: it
// deregistered the memory under the request, whose completion then failed
// with a protection error and broke the connection.
func TestRegionCloseWaitsForItsOperation(t *testing.T) {
	a, b, w := fakePair(t, fakeOpts{})
	h := heldRDMA{w.ends[0], make(chan struct{}), make(chan struct{})}
	a.t = h
	ctx := ctxT(t)
	remote, err := b.RegisterMemory(4096, true)
	require.NoError(t, err)
	defer remote.Close()
	local, err := a.RegisterMemory(4096, false)
	require.NoError(t, err)
	copy(local.Bytes(), "in flight")
	wrote := make(chan error, 1)
	go func() { wrote <- a.WriteRemote(ctx, local, 0, 9, remote.Descriptor(), 0) }()
	<-h.posted
	closed := make(chan error, 1)
	go func() { closed <- local.Close() }()
	select {
	case <-closed:
		t.Fatal("Region.Close returned while a write from it was in flight")
	case <-time.After(50 * time.Millisecond):
	}
	close(h.finish)
	require.NoError(t, <-wrote)
	require.NoError(t, <-closed)
	require.Equal(t, "in flight", string(remote.Bytes()[:9]))
	require.NoError(t, a.Send(ctx, []byte("still up")))
}
