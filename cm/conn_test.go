package cm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/nettest"

	"github.com/goxrc/goxrc/internal/conntest"
	"github.com/goxrc/goxrc/verbs"
)

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestConnMessagesByteExact(t *testing.T) {
	a, b, _ := fakePair(t, fakeOpts{})
	ctx := ctxT(t)
	buf := make([]byte, 256)
	for i := 0; i < 100; i++ {
		msg := bytes.Repeat([]byte{byte(i)}, i+1)
		require.NoError(t, a.Send(ctx, msg))
		n, err := b.Recv(ctx, buf)
		require.NoError(t, err)
		require.Equal(t, msg, buf[:n])
	}
	require.NoError(t, b.SendWithImm(ctx, []byte("imm"), 0xdeadbeef))
	n, imm, ok, err := a.RecvWithImm(ctx, buf)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, uint32(0xdeadbeef), imm)
	require.Equal(t, "imm", string(buf[:n]))
	require.Equal(t, uint64(100), a.Stats().MessagesSent)
	require.Equal(t, uint64(100), b.Stats().MessagesReceived)
}

// A fast sender against a slow receiver with tiny queues: credits must
// stop the sender rather than overrun the receive queue (the fake fails a
// send that finds no buffer, and fakePair's cleanup checks none did).
func TestConnFlowControlNeverOverruns(t *testing.T) {
	for _, depth := range []int{2, 3, 5, 16} {
		t.Run("", func(t *testing.T) {
			a, b, _ := fakePair(t, fakeOpts{depth: [2]int{depth, depth}})
			ctx := ctxT(t)
			const count = 3000
			errc := make(chan error, 1)
			go func() {
				r := rand.New(rand.NewPCG(1, uint64(depth)))
				for i := 0; i < count; i++ {
					msg := make([]byte, 1+r.IntN(255))
					for j := range msg {
						msg[j] = byte(i + j)
					}
					if err := a.Send(ctx, msg); err != nil {
						errc <- err
						return
					}
				}
				errc <- nil
			}()
			r := rand.New(rand.NewPCG(1, uint64(depth)))
			buf := make([]byte, 256)
			for i := 0; i < count; i++ {
				if i%500 == 0 {
					time.Sleep(5 * time.Millisecond) // let the sender run dry
				}
				n, err := b.Recv(ctx, buf)
				require.NoError(t, err)
				want := 1 + r.IntN(255)
				require.Equal(t, want, n, "message %d", i)
				for j := 0; j < n; j++ {
					if buf[j] != byte(i+j) {
						t.Fatalf("message %d byte %d corrupt", i, j)
					}
				}
			}
			require.NoError(t, <-errc)
		})
	}
}

// Both sides flood each other with the smallest queues: neither may end up
// waiting for credits the other can never return.
func TestConnBidirectionalFloodNoDeadlock(t *testing.T) {
	a, b, _ := fakePair(t, fakeOpts{depth: [2]int{2, 3}})
	ctx := ctxT(t)
	const count = 5000
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for _, c := range []*Conn{a, b} {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for i := 0; i < count; i++ {
				if err := c.Send(ctx, []byte{byte(i), byte(i >> 8)}); err != nil {
					errs <- err
					return
				}
			}
		}()
		go func() {
			defer wg.Done()
			buf := make([]byte, 256)
			for i := 0; i < count; i++ {
				n, err := c.Recv(ctx, buf)
				if err != nil {
					errs <- err
					return
				}
				if n != 2 || buf[0] != byte(i) || buf[1] != byte(i>>8) {
					errs <- errors.New("out of order or corrupt")
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func TestConnMessageTooLong(t *testing.T) {
	a, b, _ := fakePair(t, fakeOpts{msgSize: [2]int{100, 64}})
	ctx := ctxT(t)
	require.Equal(t, 64, a.MaxMessageSize(), "the smaller limit wins")
	err := a.Send(ctx, make([]byte, 65))
	require.ErrorIs(t, err, ErrMessageTooLong)
	require.NoError(t, a.Send(ctx, make([]byte, 64)))
	_, err = b.Recv(ctx, make([]byte, 10))
	require.ErrorIs(t, err, ErrMessageTooLong)
	n, err := b.Recv(ctx, make([]byte, 64))
	require.NoError(t, err, "the message stays queued after a short buffer")
	require.Equal(t, 64, n)
}

// A frame that breaks the protocol fails the connection with ErrProtocol,
// and counts one error whichever check catches it (a bad kind, sequence or
// credits field counted two: one in handle, one in the failure).
func TestConnGarbageFromPeer(t *testing.T) {
	for name, corrupt := range map[string]func(uint32) uint32{
		"kind":     func(imm uint32) uint32 { return imm &^ (3 << 30) },
		"sequence": func(imm uint32) uint32 { return imm ^ 1 },
		"credits":  func(imm uint32) uint32 { return imm | 0xfff<<16 },
		// Within what one frame may return, past what b is owed.
		"credit sum": func(imm uint32) uint32 { return imm&^(0xfff<<16) | 9<<16 },
	} {
		t.Run(name, func(t *testing.T) {
			a, b, w := fakePair(t, fakeOpts{})
			ctx := ctxT(t)
			w.mu.Lock()
			w.ends[0].corrupt = corrupt
			w.mu.Unlock()
			require.NoError(t, a.Send(ctx, []byte("hello")))
			_, err := b.Recv(ctx, make([]byte, 256))
			require.ErrorIs(t, err, ErrProtocol)
			var oe *OpError
			require.ErrorAs(t, err, &oe)
			require.Equal(t, "recv", oe.Op)
			require.Equal(t, uint64(1), b.Stats().Errors, "one broken frame, one error")
			// The broken connection stays broken.
			require.ErrorIs(t, b.Send(ctx, []byte("x")), ErrProtocol)
		})
	}
}

func TestConnGracefulCloseDeliversThenEOF(t *testing.T) {
	a, b, _ := fakePair(t, fakeOpts{})
	ctx := ctxT(t)
	for i := 0; i < 5; i++ {
		require.NoError(t, a.Send(ctx, []byte{byte(i)}))
	}
	require.NoError(t, a.Close())
	require.NoError(t, a.Close(), "Close is idempotent")
	buf := make([]byte, 8)
	for i := 0; i < 5; i++ {
		n, err := b.Recv(ctx, buf)
		require.NoError(t, err)
		require.Equal(t, []byte{byte(i)}, buf[:n])
	}
	_, err := b.Recv(ctx, buf)
	require.ErrorIs(t, err, io.EOF)
	require.ErrorIs(t, a.Send(ctx, []byte("late")), ErrClosed)
}

// CloseWrite ends one direction: the peer reads what came before, then
// io.EOF, and keeps sending (more than a window of messages, so credits
// must still come back over the closed side) until its Close.
func TestConnCloseWriteHalfCloses(t *testing.T) {
	a, b, _ := fakePair(t, fakeOpts{})
	ctx := ctxT(t)
	for i := range 3 {
		require.NoError(t, a.Send(ctx, []byte{byte(i)}))
	}
	require.NoError(t, a.CloseWrite())
	require.NoError(t, a.CloseWrite(), "CloseWrite is idempotent")
	require.ErrorIs(t, a.Send(ctx, []byte("late")), ErrClosed)
	buf := make([]byte, 8)
	for i := range 3 {
		n, err := b.Recv(ctx, buf)
		require.NoError(t, err)
		require.Equal(t, []byte{byte(i)}, buf[:n])
	}
	_, err := b.Recv(ctx, buf)
	require.ErrorIs(t, err, io.EOF)

	const back = 100 // the queue depth is 8
	sent := make(chan error, 1)
	go func() {
		for i := range back {
			if err := b.Send(ctx, []byte{byte(i)}); err != nil {
				sent <- err
				return
			}
		}
		sent <- b.Close()
	}()
	for i := range back {
		n, err := a.Recv(ctx, buf)
		require.NoError(t, err, "message %d after CloseWrite", i)
		require.Equal(t, []byte{byte(i)}, buf[:n])
	}
	_, err = a.Recv(ctx, buf)
	require.ErrorIs(t, err, io.EOF, "the peer's Close ends the other direction")
	require.NoError(t, <-sent)
	require.NoError(t, a.Close())
	require.Zero(t, a.Stats().Errors)
	require.Zero(t, b.Stats().Errors)

	r, _, _ := fakePair(t, fakeOpts{raw: true})
	require.ErrorIs(t, r.CloseWrite(), ErrNotSupported, "raw messages have no end of stream")
	c, _, _ := fakePair(t, fakeOpts{})
	require.NoError(t, c.Close())
	require.ErrorIs(t, c.CloseWrite(), ErrClosed)
}

// A proxy's pattern over the stream adapter: write a request, half-close,
// read the whole response until EOF.
func TestNetConnCloseWrite(t *testing.T) {
	a, b, _ := fakePair(t, fakeOpts{msgSize: [2]int{256, 256}})
	conntest.HalfClose(t, a.NetConn(), b.NetConn(), 300)
}

func TestConnPeerDeathWakesBlockedCalls(t *testing.T) {
	a, b, w := fakePair(t, fakeOpts{depth: [2]int{2, 2}})
	ctx := ctxT(t)
	recvErr := make(chan error, 1)
	go func() {
		_, err := b.Recv(ctx, make([]byte, 256))
		recvErr <- err
	}()
	// Fill a's credits so its next Send blocks.
	for i := 0; i < 2; i++ {
		require.NoError(t, a.Send(ctx, []byte("x")))
	}
	sendErr := make(chan error, 1)
	go func() {
		for {
			if err := a.Send(ctx, []byte("y")); err != nil {
				sendErr <- err
				return
			}
		}
	}()
	<-recvErr // b got the first message
	time.Sleep(20 * time.Millisecond)
	// b's process dies: its QP goes to error, a's CM sees a disconnect.
	w.ends[1].shutdown()
	a.peerGone("peer disconnected")
	select {
	case err := <-sendErr:
		require.ErrorIs(t, err, ErrPeerGone)
	case <-time.After(5 * time.Second):
		t.Fatal("blocked Send was not woken by the peer's death")
	}
}

func TestConnContextEndsWait(t *testing.T) {
	_, b, _ := fakePair(t, fakeOpts{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := b.Recv(ctx, make([]byte, 256))
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded, "as OpError's doc says")
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	require.True(t, ne.Timeout())
	require.Less(t, time.Since(start), 2*time.Second)
}

func TestConnCloseWakesBlockedRecv(t *testing.T) {
	_, b, _ := fakePair(t, fakeOpts{})
	errc := make(chan error, 1)
	go func() {
		_, err := b.Recv(context.Background(), make([]byte, 256))
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, b.Close())
	select {
	case err := <-errc:
		require.ErrorIs(t, err, ErrClosed)
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not wake Recv")
	}
}

func TestConnRawModeHasNoFraming(t *testing.T) {
	a, b, w := fakePair(t, fakeOpts{raw: true, depth: [2]int{4, 4}})
	ctx := ctxT(t)
	require.NoError(t, a.Send(ctx, []byte("0123456789abcdef")))
	buf := make([]byte, 256)
	n, err := b.Recv(ctx, buf)
	require.NoError(t, err)
	require.Equal(t, "0123456789abcdef", string(buf[:n]))
	require.Equal(t, "0123456789abcdef", string(w.ends[1].recvBufs[0][:16]), "bytes on the wire are the payload alone")
}

func TestConnOneSided(t *testing.T) {
	a, b, _ := fakePair(t, fakeOpts{})
	ctx := ctxT(t)
	remote, err := b.RegisterMemory(4096, RemoteRead|RemoteWrite)
	require.NoError(t, err)
	defer remote.Close()
	desc, err := UnmarshalRemoteRegion(remote.Descriptor().Marshal())
	require.NoError(t, err)
	local, err := a.RegisterMemory(4096, 0)
	require.NoError(t, err)
	defer local.Close()
	copy(local.Bytes(), "written by a")
	require.NoError(t, a.WriteRemote(ctx, local, 0, 12, desc, 100))
	require.Equal(t, "written by a", string(remote.Bytes()[100:112]))
	copy(remote.Bytes()[200:], "read by a")
	require.NoError(t, a.ReadRemote(ctx, local, 1000, 9, desc, 200))
	require.Equal(t, "read by a", string(local.Bytes()[1000:1009]))
	require.Error(t, a.WriteRemote(ctx, local, 0, 10, desc, 4090), "beyond the remote region")
	// Ranges whose ends wrap past the top of their types: refused, not
	// passed on (the fake used to panic on its slice bounds).
	require.Error(t, a.WriteRemote(ctx, local, math.MaxInt, 2, desc, 0), "local offset + length wraps")
	require.Error(t, a.WriteRemote(ctx, local, 0, 16, desc, math.MaxUint64-7), "remote offset + length wraps")
	require.Error(t, a.ReadRemote(ctx, local, 4090, 10, desc, 0), "beyond the local region")
	require.NoError(t, remote.Close())
	err = a.WriteRemote(ctx, local, 0, 10, desc, 0)
	require.Error(t, err, "a revoked region is not writable")
}

// A region registered with RemoteRead alone can be read by the peer, and a
// write into it fails with the device's access error, which breaks the
// connection, as on a device.
func TestConnOneSidedReadOnlyRegion(t *testing.T) {
	a, b, _ := fakePair(t, fakeOpts{})
	ctx := ctxT(t)
	exposed, err := b.RegisterMemory(64, RemoteRead)
	require.NoError(t, err)
	defer exposed.Close()
	copy(exposed.Bytes(), "readable")
	local, err := a.RegisterMemory(64, 0)
	require.NoError(t, err)
	defer local.Close()
	require.NoError(t, a.ReadRemote(ctx, local, 0, 8, exposed.Descriptor(), 0))
	require.Equal(t, "readable", string(local.Bytes()[:8]))
	require.Error(t, a.WriteRemote(ctx, local, 0, 8, exposed.Descriptor(), 0))
	require.Equal(t, "readable", string(exposed.Bytes()[:8]), "written all the same")
	require.ErrorIs(t, a.Send(ctx, []byte("after")), ErrPeerGone)
}

// A region grants the peer what RegisterMemory asked and nothing more: a
// write-only one is written and not read, a local-only one (no access) is
// neither; each refusal breaks the peer's connection, as on a device.
// Unknown access bits are refused before anything is registered.
func TestConnOneSidedAccessGranted(t *testing.T) {
	ctx := ctxT(t)
	for _, tc := range []struct {
		name          string
		access        Access
		read, written bool
	}{
		{"write-only", RemoteWrite, false, true},
		{"local-only", 0, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, write := range []bool{true, false} {
				a, b, _ := fakePair(t, fakeOpts{})
				region, err := b.RegisterMemory(64, tc.access)
				require.NoError(t, err)
				defer region.Close()
				copy(region.Bytes(), "original")
				local, err := a.RegisterMemory(64, 0)
				require.NoError(t, err)
				defer local.Close()
				copy(local.Bytes(), "incoming")
				op, allowed := a.ReadRemote, tc.read
				if write {
					op, allowed = a.WriteRemote, tc.written
				}
				err = op(ctx, local, 0, 8, region.Descriptor(), 0)
				if allowed {
					require.NoError(t, err, "write %v", write)
					require.NoError(t, a.Send(ctx, []byte("after")))
					continue
				}
				require.Error(t, err, "write %v", write)
				require.Equal(t, "original", string(region.Bytes()[:8]), "written all the same")
				require.Equal(t, "incoming", string(local.Bytes()[:8]), "read all the same")
				require.ErrorIs(t, a.Send(ctx, []byte("after")), ErrPeerGone)
			}
		})
	}
	a, _, _ := fakePair(t, fakeOpts{})
	r, err := a.RegisterMemory(64, RemoteWrite<<1)
	require.ErrorIs(t, err, ErrInvalid)
	require.Nil(t, r)
}

func TestConnZeroAllocsPerMessage(t *testing.T) {
	a, b, _ := fakePair(t, fakeOpts{})
	ctx := context.Background()
	msg := make([]byte, 64)
	buf := make([]byte, 256)
	allocs := testing.AllocsPerRun(1000, func() {
		if err := a.Send(ctx, msg); err != nil {
			t.Fatal(err)
		}
		if _, err := b.Recv(ctx, buf); err != nil {
			t.Fatal(err)
		}
	})
	require.Zero(t, allocs, "send/receive hot path allocates")

	// The net.Conn adapter too: its reads and writes share a context per
	// deadline instead of making one each.
	na, nb := a.NetConn(), b.NetConn()
	allocs = testing.AllocsPerRun(1000, func() {
		if _, err := na.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := nb.Read(buf); err != nil {
			t.Fatal(err)
		}
	})
	require.Zero(t, allocs, "NetConn Write/Read allocate")
}

func TestNetConnConformance(t *testing.T) {
	nettest.TestConn(t, func() (c1, c2 net.Conn, stop func(), err error) {
		a, b, _ := fakePair(t, fakeOpts{depth: [2]int{16, 16}, msgSize: [2]int{4096, 4096}})
		return a.NetConn(), b.NetConn(), func() { a.Close(); b.Close() }, nil
	})
}

// An idle connection probes its peer; when the peer's node is gone the
// probe fails, and a Recv blocked on the idle connection learns of it.
func TestConnKeepaliveDetectsDeadPeer(t *testing.T) {
	a, b, w := fakePair(t, fakeOpts{keepalive: 10 * time.Millisecond})
	ctx := ctxT(t)
	errc := make(chan error, 1)
	go func() { _, err := a.Recv(ctx, make([]byte, 64)); errc <- err }()
	require.Eventually(t, func() bool { return a.Stats().Keepalives >= 3 },
		5*time.Second, 5*time.Millisecond, "an idle side whose Recv waits sends probes")
	// Probes are not frames: they take no credit and no buffer.
	require.NoError(t, b.Send(ctx, []byte("still here")))
	require.NoError(t, <-errc)
	go func() { _, err := a.Recv(ctx, make([]byte, 64)); errc <- err }()

	// b's node vanishes without a disconnect: only a's probe can tell.
	requireProbeNotices(t, w, errc, "a blocked Recv on an idle connection")
}

// requireProbeNotices makes side 1's node vanish without a word and checks
// that the blocked call whose result errc carries fails with ErrPeerGone:
// only a keepalive probe can tell it.
func requireProbeNotices(t *testing.T, w *fakeWire, errc <-chan error, what string) {
	t.Helper()
	w.mu.Lock()
	w.ends[1].shut = true
	w.mu.Unlock()
	select {
	case err := <-errc:
		require.ErrorIs(t, err, ErrPeerGone, what)
	case <-time.After(5 * time.Second):
		t.Fatalf("%s never learned the peer was gone", what)
	}
}

// Probes go on while the peer's application reads nothing and every credit
// is spent: a sender blocked for credit learns that the peer's node is gone.
// (Probes were credit frames: they kept the last credit back, so they
// stopped after the queue depth and the Send waited for its context.)
func TestConnKeepaliveWithoutCredit(t *testing.T) {
	const depth = 4
	a, _, w := fakePair(t, fakeOpts{depth: [2]int{depth, depth}, keepalive: 5 * time.Millisecond})
	ctx := ctxT(t)
	for range depth {
		require.NoError(t, a.Send(ctx, []byte("unread")))
	}
	errc := make(chan error, 1)
	go func() { errc <- a.Send(ctx, []byte("no credit for this")) }()
	require.Eventually(t, func() bool { return a.Stats().Keepalives >= 3*depth },
		5*time.Second, 5*time.Millisecond, "probes stopped while the peer read nothing")
	select {
	case err := <-errc:
		t.Fatalf("the Send without credit returned: %v", err)
	default:
	}
	requireProbeNotices(t, w, errc, "a Send waiting for credit")
}

// A probe that the peer's device has not answered yet: no second probe goes
// out meanwhile, sends and a one-sided operation fill the send queue beside
// it (within its size: fakePair checks), and Close flushes it without
// counting an error or waiting for it.
func TestConnProbeOutstanding(t *testing.T) {
	const depth = 4
	a, b, _ := fakePair(t, fakeOpts{depth: [2]int{depth, depth}, keepalive: 2 * time.Millisecond, holdProbes: true})
	ctx := ctxT(t)
	recvErr := make(chan error, 1)
	go func() { _, err := a.Recv(ctx, make([]byte, 64)); recvErr <- err }()
	require.Eventually(t, func() bool { return a.Stats().Keepalives == 1 }, 5*time.Second, time.Millisecond)
	time.Sleep(30 * time.Millisecond)
	require.Equal(t, uint64(1), a.Stats().Keepalives, "a second probe while the first is out")

	exposed, err := b.RegisterMemory(64, RemoteRead|RemoteWrite)
	require.NoError(t, err)
	defer exposed.Close()
	local, err := a.RegisterMemory(64, 0)
	require.NoError(t, err)
	defer local.Close()
	for range depth {
		require.NoError(t, a.Send(ctx, []byte("beside the probe")))
	}
	require.NoError(t, a.WriteRemote(ctx, local, 0, 8, exposed.Descriptor(), 0))

	start := time.Now()
	require.NoError(t, a.Close())
	require.Less(t, time.Since(start), time.Second, "Close waited for the probe")
	require.ErrorIs(t, <-recvErr, ErrClosed)
	require.Zero(t, a.Stats().Errors, "the flushed probe counted as a failure")
}

// Close's failures are *OpError values, as every other call's are (the
// transport's error came back bare: a time-wait that outlasted Close's bound
// did not match os.ErrDeadlineExceeded).
func TestConnCloseErrorIsOpError(t *testing.T) {
	a, _, w := fakePair(t, fakeOpts{})
	w.mu.Lock()
	w.ends[0].releaseErr = fmt.Errorf("waiting for the CM to leave time-wait: %w", context.DeadlineExceeded)
	w.mu.Unlock()
	err := a.Close()
	var oe *OpError
	require.ErrorAs(t, err, &oe)
	require.Equal(t, "close", oe.Op)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
}

// A wait can end with a deadline error while the context does not yet
// report itself done (the netpoller's deadline and the context's timer are
// two timers): that ends the call, not the connection.
func TestConnEarlyDeadlineLeavesConnUsable(t *testing.T) {
	a, b, w := fakePair(t, fakeOpts{})
	w.mu.Lock()
	w.ends[1].pollErr = context.DeadlineExceeded
	w.mu.Unlock()
	_, err := b.Recv(context.Background(), make([]byte, 16))
	require.ErrorIs(t, err, context.DeadlineExceeded)
	ctx := ctxT(t)
	require.NoError(t, a.Send(ctx, []byte("after")))
	buf := make([]byte, 16)
	n, err := b.Recv(ctx, buf)
	require.NoError(t, err, "the connection survives a wait that ended early")
	require.Equal(t, "after", string(buf[:n]))
}

// Sends are signaled once in a few: one completion frees every slot posted
// before it. Every slot must come back (the sender would stall otherwise)
// and none may be reused before a completion covers it (the fake counts
// that, checked in fakePair's cleanup).
func TestConnSelectiveSignalingFreesSlotsInOrder(t *testing.T) {
	for _, depth := range []int{2, 3, 8, 64} {
		t.Run("", func(t *testing.T) {
			a, b, w := fakePair(t, fakeOpts{depth: [2]int{depth, depth}})
			ctx := ctxT(t)
			const count = 2000
			errc := make(chan error, 1)
			go func() {
				buf := make([]byte, 256)
				for i := 0; i < count; i++ {
					if i%300 == 0 {
						time.Sleep(2 * time.Millisecond) // let the sender run out of slots
					}
					n, err := b.Recv(ctx, buf)
					if err != nil {
						errc <- err
						return
					}
					if n != 3 || buf[0] != byte(i) || buf[1] != byte(i>>8) {
						errc <- errors.New("out of order or corrupt")
						return
					}
				}
				errc <- nil
			}()
			for i := 0; i < count; i++ {
				require.NoError(t, a.Send(ctx, []byte{byte(i), byte(i >> 8), 0}))
			}
			require.NoError(t, <-errc)
			require.NoError(t, a.Close())

			w.mu.Lock()
			sends, signaled := w.ends[0].sends, w.ends[0].signaled
			w.mu.Unlock()
			a.mu.Lock()
			free, inFlight := len(a.freeSend), a.inFlight.Len()
			a.mu.Unlock()
			require.Equal(t, cap(a.freeSend), free, "every send slot is free after Close")
			require.Zero(t, inFlight)
			if a.sigEvery > 1 {
				require.Less(t, signaled, sends*3/4, "sends share completions")
			}
		})
	}
}

// The last free slot's send is signaled even when the interval is not
// reached, so a sender that used every slot has a completion to wait for.
func TestConnSignalsTheLastFreeSlot(t *testing.T) {
	a, b, w := fakePair(t, fakeOpts{depth: [2]int{64, 64}})
	ctx := ctxT(t)
	slots := cap(a.freeSend)
	a.sigEvery = slots * 2 // the interval alone would never signal
	buf := make([]byte, 256)
	for i := 0; i < 3*slots; i++ { // ping-pong: credits never run out
		require.NoError(t, a.Send(ctx, []byte{byte(i)}))
		_, err := b.Recv(ctx, buf)
		require.NoError(t, err)
		require.NoError(t, b.Send(ctx, []byte{byte(i)}))
		_, err = a.Recv(ctx, buf)
		require.NoError(t, err)
	}
	w.mu.Lock()
	signaled := w.ends[0].signaled
	w.mu.Unlock()
	require.Equal(t, 3, signaled, "one completion per round of all slots")
}

// Consumed receive buffers go back to the device in chains, not one post
// each, and the credits they stand for still reach a sender that waits.
func TestConnRecvRepostsAreBatched(t *testing.T) {
	a, b, w := fakePair(t, fakeOpts{depth: [2]int{64, 64}})
	ctx := ctxT(t)
	require.Greater(t, b.recvBatch, 1)
	const count = 1000
	errc := make(chan error, 1)
	go func() {
		for i := 0; i < count; i++ {
			if err := a.Send(ctx, []byte{byte(i)}); err != nil {
				errc <- err
				return
			}
		}
		errc <- nil
	}()
	buf := make([]byte, 256)
	for i := 0; i < count; i++ {
		n, err := b.Recv(ctx, buf)
		require.NoError(t, err)
		require.Equal(t, []byte{byte(i)}, buf[:n])
	}
	require.NoError(t, <-errc)
	w.mu.Lock()
	posts := w.ends[1].recvPosts
	w.mu.Unlock()
	// One post of all buffers at the start, then about one per batch
	// (starvation flushes add a few).
	require.Less(t, posts, 1+2*count/b.recvBatch)
	require.Greater(t, posts, count/b.recvBatch/2)
}

// The yield pacer reads the clock rarely while operations are fast and on
// every operation once they are slow, so a run of slow posts still yields
// well within the runtime's 10 ms.
func TestYieldPacerAdapts(t *testing.T) {
	c := &Conn{}
	var p yieldPacer
	for i := 0; i < 1_000_000 && p.every < maxYieldCheckEvery; i++ {
		p.tick(c)
	}
	require.Equal(t, maxYieldCheckEvery, p.every, "fast operations: read the clock every %d", maxYieldCheckEvery)

	// Slow operations (each longer than spinYield/4): every read halves
	// the interval until the clock is read on every operation.
	for i := 0; i < 2*maxYieldCheckEvery; i++ {
		time.Sleep(spinYield/4 + time.Millisecond)
		p.tick(c)
	}
	require.Equal(t, 1, p.every, "slow operations: read the clock on every one")
}

// Close racing busy and blocked callers on both sides: senders that stream,
// senders blocked on credits, receivers that drain, receivers blocked on an
// empty queue. Every call returns (a result or an error) well before any
// timeout, nothing panics or races (go test -race), and the errors are the
// closed or peer-gone kind.
func TestConnCloseRacesEveryCall(t *testing.T) {
	for round := 0; round < 20; round++ {
		a, b, _ := fakePair(t, fakeOpts{depth: [2]int{2, 2}, msgSize: [2]int{64, 64}})
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		call := func(f func() error) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					if err := f(); err != nil {
						errs <- err
						return
					}
				}
			}()
		}
		msg := make([]byte, 64)
		for _, c := range []*Conn{a, b} {
			c := c
			call(func() error { return c.Send(ctx, msg) })
			call(func() error { return c.Send(ctx, msg) })
		}
		// Only b drains; a's sends soon block on credits, a's receiver
		// blocks on an empty queue after b's messages.
		call(func() error { _, err := b.Recv(ctx, make([]byte, 64)); return err })
		call(func() error { _, err := a.Recv(ctx, make([]byte, 64)); return err })
		time.Sleep(time.Duration(round%5) * time.Millisecond)
		closer := a
		if round%2 == 1 {
			closer = b
		}
		closer.Close()
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatalf("round %d: calls still blocked after Close", round)
		}
		cancel()
		close(errs)
		for err := range errs {
			if !errors.Is(err, ErrClosed) && !errors.Is(err, ErrPeerGone) && !errors.Is(err, io.EOF) {
				t.Fatalf("round %d: a call ended with %v", round, err)
			}
		}
		a.Close()
		b.Close()
	}
}

// A post the device refuses fails the Conn with a typed error, or, when our
// own Close shut the QP under the post, reports ErrClosed.
func TestConnRefusedPost(t *testing.T) {
	a, _, w := fakePair(t, fakeOpts{})
	w.mu.Lock()
	w.ends[0].postFails = true
	w.mu.Unlock()
	err := a.Send(ctxT(t), []byte("x"))
	require.ErrorIs(t, err, ErrPeerGone)
	_, err = a.Recv(ctxT(t), make([]byte, 8))
	require.ErrorIs(t, err, ErrPeerGone, "the Conn failed with the refusal")

	c, _, w2 := fakePair(t, fakeOpts{})
	w2.mu.Lock()
	w2.ends[0].postFails = true
	w2.mu.Unlock()
	c.mu.Lock()
	c.closing = true // as Close does before it shuts the QP
	c.mu.Unlock()
	require.ErrorIs(t, c.postFrame(frameFin, nil, 0, false), ErrClosed)
	c.mu.Lock()
	defer c.mu.Unlock()
	require.NoError(t, c.err, "a refusal during our own Close is not a failure")
}

// recvAfter receives on b one message that a sends after delay.
func recvAfter(t *testing.T, a, b *Conn, delay time.Duration) {
	t.Helper()
	ctx := context.Background()
	sent := make(chan error, 1)
	go func() {
		time.Sleep(delay)
		sent <- a.Send(ctx, []byte("x"))
	}()
	if _, err := b.Recv(ctx, make([]byte, 64)); err != nil {
		t.Fatal(err)
	}
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
}

// TestBusyPollAfterFirstCompletion checks when a receiver spins: not on a
// fresh connection's first wait, and from then on, also after a wait that
// outlasted the busy-poll window (a wait that sleeps is slower than the
// window by the wake-up alone under emulation, so it says nothing about the
// next one).
func TestBusyPollAfterFirstCompletion(t *testing.T) {
	const window = 50 * time.Millisecond
	a, b, w := fakePair(t, fakeOpts{busyPoll: window})
	spins := func() int { n, _ := w.polls(1); return n }
	steps := []struct {
		what  string
		delay time.Duration
		spin  bool
	}{
		{"first wait of a fresh connection", 3 * window, false},
		{"after the first completion", 10 * time.Millisecond, true},
		{"a wait that outlasts the window", 3 * window, true},
		{"after that long wait", 10 * time.Millisecond, true},
	}
	for _, s := range steps {
		before := spins()
		recvAfter(t, a, b, s.delay)
		if spun := spins() > before; spun != s.spin {
			t.Errorf("%s: spun %v, want %v", s.what, spun, s.spin)
		}
	}
}

// TestStretchSpin checks the rule for the next wait's busy-poll window,
// over sequences of waits that found a message from the peer.
func TestStretchSpin(t *testing.T) {
	const bp = 200 * time.Microsecond
	type wait struct {
		slept bool
		took  time.Duration
		want  time.Duration // spinFor after it
	}
	late := func(took time.Duration, want time.Duration) wait { return wait{false, took, want} }
	sleep := func(took time.Duration, want time.Duration) wait { return wait{true, took, want} }
	for _, tc := range []struct {
		what     string
		busyPoll time.Duration
		waits    []wait
	}{
		{"slept just past the window, then caught, then fast again", bp, []wait{
			sleep(300*time.Microsecond, 600*time.Microsecond),
			late(250*time.Microsecond, 600*time.Microsecond),
			late(80*time.Microsecond, bp),
		}},
		{"slept near the limit", bp, []wait{sleep(1500*time.Microsecond, 1600*time.Microsecond)}},
		{"slept past the limit", bp, []wait{
			sleep(300*time.Microsecond, 600*time.Microsecond),
			sleep(1700*time.Microsecond, bp),
		}},
		{"a slow peer: four late catches stop stretching until a fast message", bp, []wait{
			sleep(500*time.Microsecond, time.Millisecond),
			late(500*time.Microsecond, time.Millisecond),
			late(500*time.Microsecond, time.Millisecond),
			late(500*time.Microsecond, time.Millisecond),
			late(500*time.Microsecond, bp),  // the fourth
			sleep(500*time.Microsecond, bp), // no stretch now
			sleep(500*time.Microsecond, bp),
			late(50*time.Microsecond, bp), // a fast message: allowed again
			sleep(500*time.Microsecond, time.Millisecond),
		}},
		{"a found message past an unstretched window is not late", bp, []wait{
			late(210*time.Microsecond, bp),
			late(210*time.Microsecond, bp),
			late(210*time.Microsecond, bp),
			late(210*time.Microsecond, bp),
			sleep(300*time.Microsecond, 600*time.Microsecond),
		}},
		{"the 2 ms cap", time.Millisecond, []wait{sleep(1500*time.Microsecond, 2*time.Millisecond)}},
		{"a window over the cap never stretches", 20 * time.Millisecond, []wait{sleep(25*time.Millisecond, 20*time.Millisecond)}},
	} {
		c := &Conn{busyPoll: tc.busyPoll, spinFor: tc.busyPoll}
		for i, w := range tc.waits {
			c.stretchSpin(w.slept, func() time.Duration { return w.took })
			if c.spinFor != w.want {
				t.Errorf("%s: wait %d (slept %v, took %v): spinFor %v, want %v", tc.what, i, w.slept, w.took, c.spinFor, w.want)
				break
			}
		}
	}
}

// TestStretchSpinReadsNoClockWhenSettled: a message caught by spinning,
// with the window not stretched, is every message of a busy ping-pong; its
// wait's length changes nothing then, so it is not measured.
func TestStretchSpinReadsNoClockWhenSettled(t *testing.T) {
	const bp = 200 * time.Microsecond
	reads := 0
	took := func() time.Duration { reads++; return 50 * time.Microsecond }
	c := &Conn{busyPoll: bp, spinFor: bp}
	c.stretchSpin(false, took)
	if reads != 0 || c.spinFor != bp {
		t.Fatalf("settled catch: %d clock reads, spinFor %v", reads, c.spinFor)
	}
	c.stretchSpin(true, took) // after a sleep the length matters
	c.spinFor = 2 * bp        // and with the window stretched
	c.stretchSpin(false, took)
	if reads != 2 || c.spinFor != bp {
		t.Fatalf("%d clock reads for a sleep and a stretched catch, want 2; spinFor %v", reads, c.spinFor)
	}
}

// lateSpinEnd shows a receiver's CQ empty to its busy polls until they
// have spun for late between them, each poll spinning its whole slice as
// the device's does: a reply that comes after that much spinning. It
// stands in for a peer that sends after a delay, which made the test
// depend on the scheduler: a receiver descheduled past the delay found the
// reply without a wait, one whose sender was descheduled past the
// stretched window slept (3 of 400 runs under -race with GOMAXPROCS=1 on
// a loaded host), and the reaper's round could take the reply before the
// wait began. The spinning counted here never exceeds the wall time
// the wait's window measures, so a window shorter than late always sleeps,
// however slow the host; a window far longer (minutes) never runs out
// before it.
type lateSpinEnd struct {
	*fakeEnd
	late atomic.Int64 // spinning the CQ stays hidden from (ns)
	spun atomic.Int64 // spinning done so far in this wait (ns)
}

func (e *lateSpinEnd) poll(ctx context.Context, cs []completion, spin time.Duration, block bool) (int, error) {
	if !block && e.spun.Load() < e.late.Load() {
		// The reaper's look (no spin) finds nothing yet either: it took
		// the reply before the wait, which then found it without one.
		for t0 := time.Now(); time.Since(t0) < spin; {
		}
		e.spun.Add(int64(spin))
		return 0, nil
	}
	return e.fakeEnd.poll(ctx, cs, spin, block)
}

// TestStretchedSpinCatchesLateReply checks that the stretched window is the
// one a wait spins for: a reply later than busyPoll but within the
// stretched window is found by spinning, without a sleep.
func TestStretchedSpinCatchesLateReply(t *testing.T) {
	const window = 2 * time.Millisecond
	a, b, w := fakePair(t, fakeOpts{busyPoll: window})
	late := &lateSpinEnd{fakeEnd: w.ends[1]}
	b.t = late
	blocks := func() int { _, n := w.polls(1); return n }
	ctx := ctxT(t)
	recvLate := func(after time.Duration) {
		t.Helper()
		late.late.Store(int64(after))
		late.spun.Store(0)
		require.NoError(t, a.Send(ctx, []byte("x")))
		_, err := b.Recv(ctx, make([]byte, 64))
		require.NoError(t, err)
	}
	recvLate(0)           // the first completion: spinning starts
	b.spinFor = time.Hour // as a stretch would set it (the cap aside); no stall of the host outlasts it
	before := blocks()
	recvLate(5 * window)
	if n := blocks(); n != before {
		t.Errorf("a reply 5 windows late slept (%d sleeping polls) although the window was stretched", n-before)
	}
	b.spinFor = window
	recvLate(5 * window)
	if blocks() == before {
		t.Error("a reply 5 windows late was found without a sleep, with the window not stretched")
	}
}

// A peer that stopped answering (the transport's retries ran out, and the CM
// never said it disconnected) is not waited for by Close; any other broken
// connection is (the rdma transport then waits for the CM's time-wait).
func TestConnCloseDoesNotWaitForVanishedPeer(t *testing.T) {
	retries := &verbs.CompletionError{Status: verbs.WCRetryExcErr, QPNum: 17}
	for _, tc := range []struct {
		name     string
		err      error
		peerLeft string
		vanished bool
	}{
		{"retries ran out", retries, "", true},
		{"retries ran out after a disconnect", retries, "peer disconnected", false},
		{"RNR retries ran out", &verbs.CompletionError{Status: verbs.WCRNRRetryExcErr}, "", false},
		{"flushed", &verbs.CompletionError{Status: verbs.WCWRFlushErr}, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, _, w := fakePair(t, fakeOpts{})
			a.mu.Lock()
			a.peerLeft = tc.peerLeft
			a.failedCompletionLocked(tc.err)
			a.mu.Unlock()
			_, err := a.Recv(ctxT(t), make([]byte, 256))
			require.ErrorIs(t, err, ErrPeerGone)
			if tc.peerLeft == "" {
				var ce *verbs.CompletionError
				require.ErrorAs(t, err, &ce, "the completion's details stay reachable")
			}
			require.NotContains(t, err.Error(), "QP", "no QP numbers in what applications read")
			if tc.vanished {
				require.ErrorContains(t, err, "connection lost: transport retry counter exceeded (the peer stopped answering)")
			}
			require.NoError(t, a.Close())
			w.mu.Lock()
			defer w.mu.Unlock()
			require.Equal(t, tc.vanished, w.ends[0].releasedVanished)
		})
	}
}

// A second Close while the first is still sending its FIN waits for it:
// it used to release the connection at once, the FIN never went, and the
// peer read "connection lost" instead of io.EOF after the last message.
func TestConnConcurrentCloseKeepsGraceful(t *testing.T) {
	a, b, _ := fakePair(t, fakeOpts{depth: [2]int{2, 2}})
	ctx := ctxT(t)
	require.NoError(t, a.Send(ctx, []byte("last words")))
	// a's FIN must wait for room, as after a credit frame took a's last
	// credit; b gives it back below.
	a.mu.Lock()
	saved := a.credits
	a.credits = 0
	a.mu.Unlock()
	first := make(chan error, 1)
	go func() { first <- a.Close() }()
	time.Sleep(20 * time.Millisecond) // the first Close waits to send its FIN
	second := make(chan error, 1)
	go func() { second <- a.Close() }()
	time.Sleep(20 * time.Millisecond)
	a.mu.Lock()
	a.credits = saved // what a credit return does; b's message ends a's wait
	a.mu.Unlock()
	require.NoError(t, b.Send(ctx, []byte("credit")))
	require.NoError(t, <-first)
	require.NoError(t, <-second)
	buf := make([]byte, 64)
	n, err := b.Recv(ctx, buf)
	require.NoError(t, err)
	require.Equal(t, "last words", string(buf[:n]))
	_, err = b.Recv(ctx, buf)
	require.ErrorIs(t, err, io.EOF, "the FIN, sent by the first Close")
}

// Bad options are refused, each with an error that names it, before any
// device or CM work (a negative backlog panicked Listen after its id was
// listening).
func TestOptionsRefused(t *testing.T) {
	for _, tc := range []struct {
		opt  Option
		want string
	}{
		{WithQueueDepth(0), "queue depth"},
		{WithMessageSize(1<<30 + 1), "message size"},
		{WithInlineThreshold(-1), "inline threshold"},
		{WithHandshakeTimeout(0), "handshake timeout"},
		{WithBusyPoll(-time.Second), "busy-poll"},
		{WithKeepalive(-time.Second), "keepalive"},
		{WithBacklog(-1), "backlog"},
		{WithBacklog(math.MaxInt), "backlog"},
	} {
		_, err := newConfig([]Option{tc.opt})
		require.ErrorContains(t, err, tc.want)
		require.ErrorIs(t, err, ErrInvalid, tc.want)
	}
	_, err := newConfig(nil)
	require.NoError(t, err, "the defaults")
}

// A second Send or Recv waiting behind one that is blocked without a
// deadline (no credit; no message) gives up when its own context ends.
func TestConnSecondCallerHonoursContext(t *testing.T) {
	for _, op := range []string{"send", "recv"} {
		t.Run(op, func(t *testing.T) {
			a, _, _ := fakePair(t, fakeOpts{depth: [2]int{2, 2}})
			bg, cancelBG := context.WithCancel(context.Background())
			call := func(ctx context.Context) error {
				if op == "send" {
					return a.Send(ctx, make([]byte, 16))
				}
				_, err := a.Recv(ctx, make([]byte, 256))
				return err
			}
			first := make(chan struct{})
			go func() {
				defer close(first)
				for call(bg) == nil { // sends until out of credit; the peer never reads
				}
			}()
			time.Sleep(50 * time.Millisecond)
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			second := make(chan error, 1)
			go func() { second <- call(ctx) }()
			defer func() { cancelBG(); <-first }()
			select {
			case err := <-second:
				require.True(t, errors.Is(err, context.DeadlineExceeded), "second %s: %v", op, err)
			case <-time.After(2 * time.Second):
				t.Fatalf("second %s with a 100 ms deadline still waiting after 2 s", op)
			}
		})
	}
}

// Close wakes a blocked Recv at once, even where its FIN must wait for a
// credit the peer (alive, not reading) does not return: the Recv slept on
// until the FIN's wait ran out (the handshake timeout, 30 s by default).
func TestConnCloseWakesRecvWhileFinWaits(t *testing.T) {
	a, b, _ := fakePair(t, fakeOpts{depth: [2]int{2, 2}, msgSize: [2]int{64, 64}})
	ctx := ctxT(t)
	msg := make([]byte, 8)
	credits := func() int {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.credits
	}
	for credits() >= 2 { // a sends until data may not take the last credit
		require.NoError(t, a.Send(ctx, msg))
	}
	for range 2 { // a reads b's messages: its credit return takes the last one
		require.NoError(t, b.Send(ctx, msg))
		_, err := a.Recv(ctx, make([]byte, 64))
		require.NoError(t, err)
	}
	require.Zero(t, credits(), "setup: a holds no credit, so its FIN must wait")
	recvErr := make(chan error, 1)
	go func() {
		_, err := a.Recv(context.Background(), make([]byte, 64))
		recvErr <- err
	}()
	require.Eventually(t, func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.polling
	}, 5*time.Second, time.Millisecond, "the Recv never started waiting")
	closed := make(chan error, 1)
	go func() { closed <- a.Close() }()
	select {
	case err := <-recvErr:
		require.ErrorIs(t, err, ErrClosed)
	case <-time.After(a.timeout / 2):
		t.Fatalf("Close did not wake the blocked Recv within %v", a.timeout/2)
	}
	// The peer reads: the FIN goes out, and Close finishes.
	for {
		_, err := b.Recv(ctx, make([]byte, 64))
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
	}
	require.NoError(t, <-closed)
}

// Recv after Close returns ErrClosed, also where the peer's FIN was read:
// it returned io.EOF again, and the net.Conn adapter the same.
func TestConnRecvAfterClose(t *testing.T) {
	a, b, _ := fakePair(t, fakeOpts{})
	ctx := ctxT(t)
	require.NoError(t, a.CloseWrite())
	_, err := b.Recv(ctx, make([]byte, 64))
	require.ErrorIs(t, err, io.EOF)
	require.NoError(t, b.Close())
	_, err = b.Recv(ctx, make([]byte, 64))
	require.ErrorIs(t, err, ErrClosed)
	_, err = b.NetConn().Read(make([]byte, 64))
	require.ErrorIs(t, err, net.ErrClosed)
}

// The net.Conn adapter's Read and Write fail with net.ErrClosed after its
// Close, as a TCPConn's do, also with bytes of a message still buffered (a
// Read returned them) and for empty buffers (both returned nil).
func TestNetConnAfterClose(t *testing.T) {
	a, b, _ := fakePair(t, fakeOpts{})
	ctx := ctxT(t)
	require.NoError(t, a.Send(ctx, []byte("0123456789")))
	nb := b.NetConn()
	buf := make([]byte, 4)
	n, err := nb.Read(buf)
	require.NoError(t, err)
	require.Equal(t, 4, n)
	require.NoError(t, nb.Close())
	n, err = nb.Read(buf)
	require.ErrorIs(t, err, net.ErrClosed, "Read after Close returned %d bytes", n)
	_, err = nb.Read(nil)
	require.ErrorIs(t, err, net.ErrClosed)
	_, err = nb.Write(nil)
	require.ErrorIs(t, err, net.ErrClosed)
	_, err = nb.Write([]byte("x"))
	require.ErrorIs(t, err, net.ErrClosed)
}

// A zero-length Read returns (0, nil) at once whatever the read deadline,
// as a TCP connection's does (its Write checks the deadline first, and so
// does ours); ours returned a timeout past the deadline (a review).
func TestNetConnZeroReadIgnoresDeadline(t *testing.T) {
	_, b, _ := fakePair(t, fakeOpts{})
	nb := b.NetConn()
	tcp := tcpPair(t)
	for _, c := range []net.Conn{nb, tcp} {
		require.NoError(t, c.SetReadDeadline(time.Now().Add(-time.Second)))
		n, err := c.Read(nil)
		require.NoError(t, err, "%T", c)
		require.Zero(t, n)
	}
}

// Setting a deadline after Close fails with net.ErrClosed, as on a TCP
// connection (and net.Pipe), whose deadlines the adapter's doc says its
// own work as: it returned nil, so a caller that arms a deadline before
// each call learnt nothing of a Close from another goroutine.
func TestNetConnSetDeadlineAfterClose(t *testing.T) {
	_, b, _ := fakePair(t, fakeOpts{})
	nb := b.NetConn()
	tcp := tcpPair(t)
	for _, c := range []net.Conn{nb, tcp} {
		require.NoError(t, c.SetDeadline(time.Now().Add(time.Hour)), "%T", c)
		require.NoError(t, c.Close())
		for name, set := range map[string]func(time.Time) error{
			"SetDeadline": c.SetDeadline, "SetReadDeadline": c.SetReadDeadline, "SetWriteDeadline": c.SetWriteDeadline,
		} {
			err := set(time.Now().Add(time.Hour))
			require.ErrorIs(t, err, net.ErrClosed, "%T %s", c, name)
			var oe *net.OpError
			require.ErrorAs(t, err, &oe, "%T %s", c, name)
		}
	}
}

// tcpPair is one end of a TCP connection on the loopback, for comparisons.
func tcpPair(t *testing.T) net.Conn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	s, err := ln.Accept()
	require.NoError(t, err)
	t.Cleanup(func() { c.Close(); s.Close() })
	return c
}

// RegisterMemory on a closed connection registers nothing (it did, and the
// Region held the device for a connection that was gone).
func TestConnRegisterMemoryAfterClose(t *testing.T) {
	a, _, _ := fakePair(t, fakeOpts{})
	require.NoError(t, a.Close())
	r, err := a.RegisterMemory(4096, RemoteRead|RemoteWrite)
	if r != nil {
		r.Close()
	}
	require.ErrorIs(t, err, ErrClosed)
}

// overlapCheck records whether release ran while a poll was still under
// way; its polls linger a moment after they end, as a poll slice in C does.
type overlapCheck struct {
	*fakeEnd
	polls   *atomic.Int32
	overlap *atomic.Bool
}

func (o overlapCheck) poll(ctx context.Context, cs []completion, spin time.Duration, block bool) (int, error) {
	o.polls.Add(1)
	defer o.polls.Add(-1)
	n, err := o.fakeEnd.poll(ctx, cs, spin, block)
	time.Sleep(20 * time.Millisecond)
	return n, err
}

func (o overlapCheck) release(ctx context.Context, vanished bool) error {
	if o.polls.Load() != 0 {
		o.overlap.Store(true)
	}
	return o.fakeEnd.release(ctx, vanished)
}

// Close releases the transport only after the polling leader's round has
// ended: the RDMA transport's release drains the CQ into the array the
// leader polls into (a data race, which the old Close left open).
func TestConnCloseWaitsForThePollingLeader(t *testing.T) {
	a, _, w := fakePair(t, fakeOpts{})
	o := overlapCheck{w.ends[0], new(atomic.Int32), new(atomic.Bool)}
	a.t = o
	recvErr := make(chan error, 1)
	go func() {
		_, err := a.Recv(context.Background(), make([]byte, 64))
		recvErr <- err
	}()
	require.Eventually(t, func() bool { return o.polls.Load() == 1 }, 5*time.Second, time.Millisecond)
	// The peer goes: the connection breaks, so Close sends no FIN and
	// drains nothing, and goes straight to the release.
	a.fail(fmt.Errorf("%w: test", ErrPeerGone))
	a.Close()
	require.False(t, o.overlap.Load(), "release ran while the leader was still polling")
	require.ErrorIs(t, <-recvErr, ErrPeerGone)
}

// Recv after our Close of a connection the peer ended in order (its FIN,
// then its disconnect) is ErrClosed: it said the connection was lost, the
// disconnect's flush taken for a failure.
func TestConnRecvAfterCloseFollowingOrderlyPeerClose(t *testing.T) {
	a, b, w := fakePair(t, fakeOpts{})
	ctx := ctxT(t)
	require.NoError(t, b.CloseWrite())
	w.ends[1].shutdown() // the peer's Close disconnects after its FIN
	a.peerGone("peer disconnected")
	_, err := a.Recv(ctx, make([]byte, 64))
	require.ErrorIs(t, err, io.EOF)
	require.Zero(t, a.Stats().Errors)
	require.NoError(t, a.Close())
	_, err = a.Recv(ctx, make([]byte, 64))
	require.ErrorIs(t, err, ErrClosed)
}

// The adapter's errors are *net.OpError values, as a TCPConn's (net/http
// tells a client that went away from a bad request by them), around cm's
// reasons; a Write past its deadline fails even with no data.
func TestNetConnErrorsAreNetOpErrors(t *testing.T) {
	a, b, _ := fakePair(t, fakeOpts{})
	na, nb := a.NetConn(), b.NetConn()
	check := func(err error, op string, reason error) {
		t.Helper()
		var oe *net.OpError
		require.ErrorAs(t, err, &oe)
		require.Equal(t, op, oe.Op)
		require.Equal(t, "rdma", oe.Net)
		require.Equal(t, na.LocalAddr(), oe.Source)
		require.Equal(t, na.RemoteAddr(), oe.Addr)
		require.ErrorIs(t, err, reason)
		require.NotContains(t, oe.Err.Error(), oe.Addr.String(), "the address said once: %v", err)
	}
	require.NoError(t, na.SetWriteDeadline(time.Now().Add(-time.Second)))
	n, err := na.Write(nil)
	require.Zero(t, n)
	check(err, "write", os.ErrDeadlineExceeded)
	var ne net.Error
	require.ErrorAs(t, err, &ne)
	require.True(t, ne.Timeout())

	require.NoError(t, na.SetReadDeadline(time.Now().Add(20*time.Millisecond)))
	_, err = na.Read(make([]byte, 8))
	check(err, "read", os.ErrDeadlineExceeded) // expired while waiting

	require.NoError(t, nb.Close())
	require.NoError(t, na.SetDeadline(time.Time{}))
	_, err = io.ReadAll(na)
	require.NoError(t, err, "the peer's Close ends the stream")
	require.NoError(t, na.Close())
	_, err = na.Read(make([]byte, 8))
	check(err, "read", net.ErrClosed)
}
