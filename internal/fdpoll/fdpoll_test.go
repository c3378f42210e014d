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

func TestWaitDoesNotAllocateWithoutCancel(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	r, w := pipeFD(t)
	p, err := Open(r, "pipe")
	require.NoError(t, err)
	defer p.Close()
	try := drainOne(r)
	ctx := context.Background()
	allocs := testing.AllocsPerRun(100, func() {
		go unix.Write(w, []byte{1})
		if err := p.Wait(ctx, try); err != nil {
			t.Fatal(err)
		}
	})
	// The goroutine that writes costs one allocation of its own.
	require.LessOrEqual(t, allocs, 1.0)
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
