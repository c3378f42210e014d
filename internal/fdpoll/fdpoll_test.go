//go:build unix

package fdpoll

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// pipeFD stands in for a C library's event fd: readable when a byte is queued.
func pipeFD(t *testing.T) (r, w int) {
	t.Helper()
	var p [2]int
	require.NoError(t, unix.Pipe(p[:]))
	t.Cleanup(func() { unix.Close(p[0]); unix.Close(p[1]) })
	return p[0], p[1]
}

func drainOne(fd int) func() bool {
	return func() bool {
		var b [1]byte
		n, _ := unix.Read(fd, b[:])
		return n == 1
	}
}

func TestWaitWakesOnReadable(t *testing.T) {
	r, w := pipeFD(t)
	p, err := Open(r, "pipe")
	require.NoError(t, err)
	defer p.Close()
	go func() { time.Sleep(20 * time.Millisecond); unix.Write(w, []byte{1}) }()
	require.NoError(t, p.Wait(context.Background(), drainOne(r)))
}

func TestWaitHonoursCancel(t *testing.T) {
	r, _ := pipeFD(t)
	p, err := Open(r, "pipe")
	require.NoError(t, err)
	defer p.Close()
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(20 * time.Millisecond); cancel() }()
	err = p.Wait(ctx, drainOne(r))
	require.ErrorIs(t, err, context.Canceled)
}

func TestWaitHonoursDeadline(t *testing.T) {
	r, _ := pipeFD(t)
	p, err := Open(r, "pipe")
	require.NoError(t, err)
	defer p.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	err = p.Wait(ctx, drainOne(r))
	require.ErrorIs(t, err, context.DeadlineExceeded)
}

func TestCloseWakesWaiterAndKeepsLibraryFD(t *testing.T) {
	r, w := pipeFD(t)
	p, err := Open(r, "pipe")
	require.NoError(t, err)
	done := make(chan error, 1)
	go func() { done <- p.Wait(context.Background(), drainOne(r)) }()
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, p.Close())
	require.NoError(t, p.Close(), "Close is idempotent")
	select {
	case err := <-done:
		require.True(t, errors.Is(err, ErrClosed), "got %v", err)
	case <-time.After(2 * time.Second):
		t.Fatal("Close did not wake the waiter")
	}
	// The original descriptor still works.
	_, err = unix.Write(w, []byte{7})
	require.NoError(t, err)
	var b [1]byte
	n, err := unix.Read(r, b[:])
	require.NoError(t, err)
	require.Equal(t, 1, n)
}

func TestTryCalledUntilDone(t *testing.T) {
	r, w := pipeFD(t)
	p, err := Open(r, "pipe")
	require.NoError(t, err)
	defer p.Close()
	var calls atomic.Int32
	go func() {
		for i := 0; i < 3; i++ {
			time.Sleep(10 * time.Millisecond)
			unix.Write(w, []byte{1})
		}
	}()
	got := 0
	err = p.Wait(context.Background(), func() bool {
		calls.Add(1)
		if drainOne(r)() {
			got++
		}
		return got == 3
	})
	require.NoError(t, err)
	require.Equal(t, 3, got)
	require.GreaterOrEqual(t, calls.Load(), int32(3))
}

// A Wait with a context that cannot end, sleeping until a byte comes,
// allocates nothing.
func TestWaitDoesNotAllocateWithoutCancel(t *testing.T) {
	requireWaitAllocatesNothing(t, context.Background())
}

// A Wait that sleeps until a byte comes allocates nothing also with a
// context that can end (xrc's receive and send-completion loops pass the
// endpoint's, and sleep once per message): the cancellation wake-up is kept
// between Waits. It guards against allocating that wake-up on every sleep
// (four allocations each).
func TestWaitDoesNotAllocateWithCancellableContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	requireWaitAllocatesNothing(t, ctx)
}

// requireWaitAllocatesNothing: a Wait with ctx that sleeps until a byte
// comes allocates nothing.
func requireWaitAllocatesNothing(t *testing.T, ctx context.Context) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own; test/run-tests.sh runs this package without -race too")
	}
	r, w := pipeFD(t)
	p, err := Open(r, "pipe")
	require.NoError(t, err)
	defer p.Close()
	try := drainOne(r)
	allocs := testing.AllocsPerRun(100, func() {
		go unix.Write(w, []byte{1})
		if err := p.Wait(ctx, try); err != nil {
			t.Fatal(err)
		}
	})
	// The goroutine that writes costs one allocation of its own.
	require.LessOrEqual(t, allocs, 1.0)
}

// errHook is a context whose first Err runs hook and reports the context
// live: the context ends between Wait's look at it and the arming of its
// wake-up.
type errHook struct {
	context.Context
	hook func()
}

func (c *errHook) Err() error {
	if h := c.hook; h != nil {
		c.hook = nil
		h()
		return nil
	}
	return c.Context.Err()
}

// The wake-up registered for a context is kept between Waits on it: it
// still wakes a later Wait that sleeps when the context ends, also when
// the context ended (and the kept registration fired, for no Wait) just
// before the Wait armed it; another context's Wait and Close let it go.
func TestKeptCancelWakeUp(t *testing.T) {
	r, w := pipeFD(t)
	p, err := Open(r, "pipe")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	calls := 0
	first := func() bool { // sleeps once, then takes the byte
		calls++
		if calls == 2 {
			unix.Write(w, []byte{1})
		}
		return drainOne(r)()
	}
	require.NoError(t, p.Wait(ctx, first))
	done := ctx.Done()
	require.True(t, p.armedDone == done, "the registration is kept")

	// Ends while the Wait is in the netpoller (its second try).
	calls = 0
	require.ErrorIs(t, p.Wait(ctx, func() bool {
		if calls++; calls == 2 {
			cancel()
		}
		return false
	}), context.Canceled)

	// Ends just before the arming, with a registration kept.
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	calls = 0
	require.NoError(t, p.Wait(ctx2, first))
	require.True(t, p.armedDone == ctx2.Done(), "another context's Wait registers anew")
	fired := make(chan struct{}, 1)
	p.mu.Lock()
	p.testCancelled = func() { fired <- struct{}{} }
	p.mu.Unlock()
	endNow := func() { cancel2(); <-fired } // the kept registration fired, for no Wait
	res := make(chan error, 1)
	go func() { res <- p.Wait(&errHook{ctx2, endNow}, drainOne(r)) }()
	select {
	case err := <-res:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(5 * time.Second):
		t.Fatal("a context that ended as the Wait armed it did not wake it")
	}

	// A context with a deadline, most likely made per call, is let go of
	// as its Wait returns.
	ctx3, cancel3 := context.WithTimeout(context.Background(), time.Hour)
	defer cancel3()
	calls = 0
	require.NoError(t, p.Wait(ctx3, first))
	require.Nil(t, p.stopArmed, "a timed context's registration is let go of")

	ctx4, cancel4 := context.WithCancel(context.Background())
	defer cancel4()
	calls = 0
	require.NoError(t, p.Wait(ctx4, first))
	require.NotNil(t, p.stopArmed)
	require.NoError(t, p.Close())
	require.Nil(t, p.stopArmed, "Close lets go of the registration")
}

func TestDeadlineDoesNotStickToTheNextWait(t *testing.T) {
	r, w := pipeFD(t)
	p, err := Open(r, "pipe")
	require.NoError(t, err)
	defer p.Close()
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel2()
	require.Error(t, p.Wait(ctx2, drainOne(r)))
	go func() { time.Sleep(30 * time.Millisecond); unix.Write(w, []byte{1}) }()
	require.NoError(t, p.Wait(context.Background(), drainOne(r)), "an old deadline must not end a wait without one")
}

// A Close that lands between a Wait's first try and its sleep (here, inside
// try) is ErrClosed too, also when the Wait must first clear an earlier
// Wait's deadline: once seen as "use of closed file" from that reset.
func TestCloseDuringWaitIsErrClosed(t *testing.T) {
	for _, earlierDeadline := range []bool{false, true} {
		r, _ := pipeFD(t)
		p, err := Open(r, "pipe")
		require.NoError(t, err)
		if earlierDeadline {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
			require.ErrorIs(t, p.Wait(ctx, drainOne(r)), context.DeadlineExceeded)
			cancel()
		}
		err = p.Wait(context.Background(), func() bool { p.Close(); return false })
		require.ErrorIs(t, err, ErrClosed, "earlier deadline %v", earlierDeadline)
	}
}

// dupOf is the duplicate descriptor p registered with the netpoller.
func dupOf(t *testing.T, p *FD) int {
	t.Helper()
	dup := -1
	require.NoError(t, p.rc.Control(func(fd uintptr) { dup = int(fd) }))
	return dup
}

// isOpen reports whether descriptor fd is open in this process.
func isOpen(fd int) bool {
	_, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	return err == nil
}

// A try that closes the FD from inside the netpoller's read (the second and
// later calls of try run inside rc.Read) made Wait deadlock before: Close
// held p.mu and called os.File.Close, which waited for that read to release
// the file, and the read waited for try. Now Wait returns ErrClosed, having
// released the duplicate, and the library's descriptor stays open.
func TestCloseInsideTryInNetpollerDoesNotDeadlock(t *testing.T) {
	for _, done := range []bool{false, true} {
		r, w := pipeFD(t)
		p, err := Open(r, "pipe")
		require.NoError(t, err)
		dup := dupOf(t, p)
		calls := 0
		res := make(chan error, 1)
		go func() {
			res <- p.Wait(context.Background(), func() bool {
				calls++
				if calls == 2 { // inside rc.Read: RawRead calls it at once
					require.NoError(t, p.Close())
					require.NoError(t, p.Close(), "Close is idempotent")
					return done
				}
				return false
			})
		}()
		select {
		case err := <-res:
			if done {
				require.NoError(t, err, "try reported done")
			} else {
				require.ErrorIs(t, err, ErrClosed)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("done %v: Wait never returned: Close inside try deadlocks", done)
		}
		require.Equal(t, 2, calls)
		require.False(t, isOpen(dup), "the duplicate is released when Wait returns")
		require.ErrorIs(t, p.Wait(context.Background(), drainOne(r)), ErrClosed)
		_, err = unix.Write(w, []byte{7})
		require.NoError(t, err)
		require.True(t, drainOne(r)(), "the library's descriptor still works")
	}
}

// Close from another goroutine while try runs inside the netpoller's read
// used to wait, holding p.mu, until that try returned (os.File.Close waits
// for the read). Now it returns at once; the Wait returns ErrClosed after
// its try and releases the duplicate on its way out.
func TestCloseDoesNotWaitForRunningTry(t *testing.T) {
	r, _ := pipeFD(t)
	p, err := Open(r, "pipe")
	require.NoError(t, err)
	dup := dupOf(t, p)
	inTry, release := make(chan struct{}), make(chan struct{})
	calls := 0
	res := make(chan error, 1)
	go func() {
		res <- p.Wait(context.Background(), func() bool {
			calls++
			if calls == 2 {
				close(inTry)
				<-release
			}
			return false
		})
	}()
	<-inTry
	closed := make(chan error, 1)
	go func() { closed <- p.Close() }()
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(5 * time.Second):
		close(release)
		<-closed
		<-res
		t.Fatal("Close waited for a running try")
	}
	require.True(t, isOpen(dup), "the Wait, still in try, holds the duplicate")
	close(release)
	select {
	case err := <-res:
		require.ErrorIs(t, err, ErrClosed)
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not wake the waiter")
	}
	require.Equal(t, 2, calls, "try is not called again after Close")
	require.False(t, isOpen(dup), "the Wait released the duplicate")
}

// Close racing a Wait at every point (before it, in its first try, in the
// netpoller, in a later try, with or without a cancellable context) wakes
// it with ErrClosed, closes the duplicate exactly once, and keeps the
// library's descriptor. Run under -race.
func TestCloseRacingWait(t *testing.T) {
	for i := 0; i < 300; i++ {
		r, w := pipeFD(t)
		p, err := Open(r, "pipe")
		require.NoError(t, err)
		dup := dupOf(t, p)
		ctx, cancel := context.Background(), context.CancelFunc(func() {})
		if i%2 == 1 {
			ctx, cancel = context.WithCancel(context.Background())
		}
		// Close in the first try (before the netpoller), in the second
		// (inside it), or from here.
		inTry := int32(i%3 + 1)
		var calls atomic.Int32
		res := make(chan error, 1)
		go func() {
			res <- p.Wait(ctx, func() bool {
				if calls.Add(1) == inTry {
					p.Close()
				}
				drainOne(r)()
				return false
			})
		}()
		if i%5 == 0 {
			unix.Write(w, []byte{1})
		}
		if inTry == 3 {
			if i%2 == 0 {
				time.Sleep(time.Duration(i%4) * 100 * time.Microsecond)
			}
			require.NoError(t, p.Close())
		}
		select {
		case err := <-res:
			require.ErrorIs(t, err, ErrClosed, "round %d", i)
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d: Wait never returned", i)
		}
		cancel()
		require.False(t, isOpen(dup), "round %d: duplicate still open", i)
		_, err = unix.Write(w, []byte{7})
		require.NoError(t, err)
		require.True(t, drainOne(r)(), "round %d: library descriptor", i)
	}
}

// A try that panics inside the netpoller does not leave its Wait counted:
// a Close after it releases the descriptor itself, where it used to leave
// that to a waiter that was gone, and the descriptor stayed open.
func TestPanickingTryLeavesNoWaiter(t *testing.T) {
	r, _ := pipeFD(t)
	p, err := Open(r, "pipe")
	require.NoError(t, err)
	calls := 0
	func() {
		// No writer: the second try runs at once inside RawRead. A
		// goroutine writing to w later outlived the test and wrote into
		// whatever pipe the next test got under that descriptor number.
		defer func() { require.Equal(t, "boom", recover()) }()
		p.Wait(context.Background(), func() bool {
			if calls++; calls > 1 {
				panic("boom")
			}
			return false
		})
	}()
	require.Equal(t, 2, calls)
	p.mu.Lock()
	waiters := p.waiters
	p.mu.Unlock()
	require.Zero(t, waiters, "the panicked Wait is still counted")
	fd := int(p.file.Fd())
	require.NoError(t, p.Close())
	_, err = unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	require.ErrorIs(t, err, unix.EBADF, "Close left the duplicate descriptor open")
}

// BenchmarkWaitPingPong: two goroutines pass a byte back and forth over two
// pipes, each waiting for its pipe with Wait: a sleep in the netpoller and
// a wake-up per hop, the path of a connection that sleeps between messages.
func BenchmarkWaitPingPong(b *testing.B) {
	benchPingPong(b, context.Background())
}

// BenchmarkWaitPingPongCancellable: the same with a context that can end,
// as xrc's completion loops pass.
func BenchmarkWaitPingPongCancellable(b *testing.B) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	benchPingPong(b, ctx)
}

func benchPingPong(b *testing.B, ctx context.Context) {
	var p1, p2 [2]int
	require.NoError(b, unix.Pipe(p1[:]))
	require.NoError(b, unix.Pipe(p2[:]))
	defer func() {
		for _, fd := range []int{p1[0], p1[1], p2[0], p2[1]} {
			unix.Close(fd)
		}
	}()
	a, err := Open(p1[0], "a")
	require.NoError(b, err)
	defer a.Close()
	c, err := Open(p2[0], "c")
	require.NoError(b, err)
	defer c.Close()
	takeA, takeC := drainOne(p1[0]), drainOne(p2[0])
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range b.N {
			if c.Wait(ctx, takeC) != nil {
				return
			}
			unix.Write(p1[1], []byte{1})
		}
	}()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		unix.Write(p2[1], []byte{1})
		if err := a.Wait(ctx, takeA); err != nil {
			b.Fatal(err)
		}
	}
	<-done
}
