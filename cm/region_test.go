package cm

import (
	"bytes"
	"context"
	"encoding/binary"
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

// FuzzUnmarshalRemoteRegion: a descriptor from a peer is refused, with
// ErrProtocol, exactly when it has the wrong length or its range wraps;
// otherwise it decodes to a region that marshals back to the same bytes.
func FuzzUnmarshalRemoteRegion(f *testing.F) {
	f.Add(RemoteRegion{Addr: 0x7f00_0000_1000, Len: 8192, RKey: 7}.Marshal())
	f.Add(RemoteRegion{Addr: math.MaxUint64, Len: 1}.Marshal())
	f.Add(RemoteRegion{Addr: math.MaxUint64, Len: 0}.Marshal())
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := UnmarshalRemoteRegion(b)
		if err != nil {
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("%x refused with %v, not ErrProtocol", b, err)
			}
			if len(b) == RemoteRegionLen {
				if a, n := binary.BigEndian.Uint64(b), binary.BigEndian.Uint32(b[8:]); a+uint64(n) >= a {
					t.Fatalf("%x refused (%v), but it is a region that does not wrap", b, err)
				}
			}
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

// rdmaRegions registers 4 KiB on a for one-sided operations and 4 KiB on b
// that a may read and write, closed when the test ends.
func rdmaRegions(t *testing.T, a, b *Conn) (*Region, RemoteRegion) {
	t.Helper()
	remote, err := b.RegisterMemory(4096, RemoteRead|RemoteWrite)
	require.NoError(t, err)
	t.Cleanup(func() { remote.Close() })
	local, err := a.RegisterMemory(4096, 0)
	require.NoError(t, err)
	t.Cleanup(func() { local.Close() })
	return local, remote.Descriptor()
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
	local, remote := rdmaRegions(t, a, b)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	require.ErrorIs(t, a.WriteRemote(ctx, local, 0, 8, remote, 0), context.DeadlineExceeded)

	_, err := a.Recv(context.Background(), make([]byte, 256))
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
	remote, err := b.RegisterMemory(4096, RemoteRead|RemoteWrite)
	require.NoError(t, err)
	defer remote.Close()
	local, err := a.RegisterMemory(4096, 0)
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

// A one-sided call whose ctx has already ended posts nothing and leaves
// the connection up, as Send does: a free turn was taken whatever ctx
// said, and the request then posted was abandoned at once, which broke
// the connection.
func TestOneSidedEndedCtxPostsNothing(t *testing.T) {
	a, _, _, h, local, desc := flushHoldPair(t, func(e *fakeEnd) flushHold { return newFlushHold(e, true) })
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, a.WriteRemote(ctx, local, 0, 8, desc, 0), context.Canceled)
	select {
	case <-h.posted:
		t.Fatal("a request was posted under an ended ctx")
	default:
	}
	require.NoError(t, a.Send(ctxT(t), []byte("still up")))
}

// An operation on a Region whose Close is under way (waiting for another
// connection's request on it) fails at once with ErrClosed: it waited for
// the region's lock, deaf to its ctx and holding its connection's I/O, so
// that connection's Close waited as well.
func TestOneSidedOnClosingRegionFailsAtOnce(t *testing.T) {
	a1, b1, w1 := fakePair(t, fakeOpts{})
	h := heldRDMA{w1.ends[0], make(chan struct{}), make(chan struct{})}
	a1.t = h
	a2, b2, _ := fakePair(t, fakeOpts{})
	r1, err := b1.RegisterMemory(64, RemoteRead|RemoteWrite)
	require.NoError(t, err)
	defer r1.Close()
	r2, err := b2.RegisterMemory(64, RemoteRead|RemoteWrite)
	require.NoError(t, err)
	defer r2.Close()
	shared, err := a1.RegisterMemory(64, 0) // one device: a2 may use it too
	require.NoError(t, err)
	wrote := make(chan error, 1)
	go func() { wrote <- a1.WriteRemote(ctxT(t), shared, 0, 8, r1.Descriptor(), 0) }()
	<-h.posted
	closed := make(chan error, 1)
	go func() { closed <- shared.Close() }() // waits for a1's request
	// Close holds, or waits for, the write lock: TryLock fails until then.
	for shared.mu.TryRLock() {
		shared.mu.RUnlock()
		time.Sleep(time.Millisecond)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	err = a2.WriteRemote(ctx, shared, 0, 8, r2.Descriptor(), 0)
	require.ErrorIs(t, err, ErrClosed)
	require.Less(t, time.Since(start), time.Second, "waited for the region")
	require.NoError(t, a2.Send(ctx, []byte("still up")), "the region's close is no failure of the connection")
	close(h.finish)
	require.NoError(t, <-wrote)
	require.NoError(t, <-closed)
}

// A Region whose deregistration fails stays registered (the peer can still
// reach it, so it must not read as revoked) and its Close can be tried
// again; then it is revoked. The first failure was final: later Closes
// returned it without trying, and the memory stayed open to the peer.
func TestRegionCloseFailureCanBeRetried(t *testing.T) {
	a, b, _ := fakePair(t, fakeOpts{})
	exposed, err := b.RegisterMemory(64, RemoteRead|RemoteWrite)
	require.NoError(t, err)
	exposed.mem = &failingClose{memory: exposed.mem, fails: 1}
	local, err := a.RegisterMemory(64, 0)
	require.NoError(t, err)
	defer local.Close()
	ctx := ctxT(t)
	require.Error(t, exposed.Close())
	require.NoError(t, a.WriteRemote(ctx, local, 0, 8, exposed.Descriptor(), 0), "a region still registered")
	desc := exposed.Descriptor()
	require.NoError(t, exposed.Close())
	require.NoError(t, exposed.Close(), "Close is idempotent")
	require.Error(t, a.WriteRemote(ctx, local, 0, 8, desc, 0), "the peer wrote a region closed without error")
}

type failingClose struct {
	memory
	fails int
}

func (m *failingClose) close() error {
	if m.fails > 0 {
		m.fails--
		return errors.New("ibv_dereg_mr: device busy")
	}
	return m.memory.close()
}

// A closed local Region is ErrClosed, not a range error: the bounds check
// read the region's length from its memory, which a closed verbs.MR no
// longer has (unmapped, its Bytes are nil).
func TestOneSidedClosedLocalRegion(t *testing.T) {
	a, b, _ := fakePair(t, fakeOpts{})
	exposed, err := b.RegisterMemory(64, RemoteRead|RemoteWrite)
	require.NoError(t, err)
	defer exposed.Close()
	local, err := a.RegisterMemory(64, 0)
	require.NoError(t, err)
	local.mem = &unmappedOnClose{memory: local.mem}
	require.NoError(t, local.Close())
	require.ErrorIs(t, a.WriteRemote(ctxT(t), local, 0, 8, exposed.Descriptor(), 0), ErrClosed)
}

// A descriptor built by hand whose range wraps the address space is
// refused here; it was posted, and the peer's device's refusal broke the
// connection.
func TestOneSidedWrappingDescriptorRefused(t *testing.T) {
	a, _, w := fakePair(t, fakeOpts{})
	local, err := a.RegisterMemory(64, 0)
	require.NoError(t, err)
	defer local.Close()
	remote := RemoteRegion{Addr: math.MaxUint64 - 10, Len: 100, RKey: 1}
	err = a.WriteRemote(ctxT(t), local, 0, 8, remote, 50)
	require.ErrorContains(t, err, "wraps the address space")
	require.Zero(t, rdmaOutOf(w), "posted")
	require.NoError(t, a.Send(ctxT(t), []byte("still up")))
}

// unmappedOnClose has no bytes once closed, as a verbs.MR (the fake's
// memory keeps them: the stress test writes into a region it closes).
type unmappedOnClose struct {
	memory
	closed bool
}

func (m *unmappedOnClose) bytes() []byte {
	if m.closed {
		return nil
	}
	return m.memory.bytes()
}

func (m *unmappedOnClose) close() error { m.closed = true; return m.memory.close() }

// A deferred Close before the error check of RegisterMemory (or Dial's
// Conn.Close alike) must not panic on the nil it got.
func TestRegionCloseNil(t *testing.T) {
	var r *Region
	require.NotPanics(t, func() { require.NoError(t, r.Close()) })
}

// The calls that return an error take a nil Conn or Listener (a Dial or
// Listen whose error went unchecked) for a closed one, as Send, Recv,
// CloseWrite, WriteRemote and ReadRemote did: RegisterMemory, Accept and
// the Listener's Close dereferenced it and panicked.
func TestNilConnAndListenerCalls(t *testing.T) {
	var c *Conn
	var l *Listener
	ctx := context.Background()
	require.NotPanics(t, func() {
		r, err := c.RegisterMemory(64, RemoteRead|RemoteWrite)
		require.ErrorIs(t, err, ErrClosed)
		require.Nil(t, r)
	})
	require.NotPanics(t, func() {
		got, err := l.Accept(ctx)
		require.ErrorIs(t, err, ErrClosed)
		require.Nil(t, got)
	})
	require.NotPanics(t, func() { require.NoError(t, l.Close()) })
	require.NotPanics(t, func() { require.NoError(t, c.Close()) })
	require.NotPanics(t, func() { require.ErrorIs(t, c.Send(ctx, []byte("x")), ErrClosed) })
	// ErrClosed itself, no *OpError: a nil Conn has no address to name
	// (the package doc, "Errors and waiting").
	require.Equal(t, ErrClosed, c.Send(ctx, []byte("x")))
	require.NotPanics(t, func() {
		require.Nil(t, c.LocalAddr())
		require.Nil(t, c.RemoteAddr())
		require.Nil(t, l.Addr())
		require.Zero(t, c.Transport())
		require.Zero(t, c.MaxMessageSize())
		require.Zero(t, c.MaxRecvSize())
		require.Zero(t, c.Stats())
	})
	require.NotPanics(t, func() {
		nc := c.NetConn()
		_, err := nc.Read(make([]byte, 8))
		require.ErrorIs(t, err, ErrClosed)
		_, err = nc.Write([]byte("x"))
		require.ErrorIs(t, err, ErrClosed)
		require.Nil(t, nc.LocalAddr())
		require.NoError(t, nc.Close())
	})
}

// A nil Region's getters give what a closed one's give (no memory, an empty
// descriptor), as its Close and a nil Conn's getters do, instead of
// panicking.
func TestNilRegionGetters(t *testing.T) {
	var r *Region
	require.NotPanics(t, func() {
		require.Nil(t, r.Bytes())
		require.Zero(t, r.Descriptor())
	})
}
