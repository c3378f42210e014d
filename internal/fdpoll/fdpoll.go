// Package fdpoll waits for file descriptors owned by C libraries (the RDMA CM
// event channel, completion channels, the device async fd) in Go's netpoller,
// so that no goroutine ever parks in a blocking C call.
//
// The C library keeps owning its descriptor. FD registers a duplicate with the
// netpoller: epoll reports readiness of the shared open file description, and
// closing the duplicate never closes the library's descriptor.
package fdpoll

import (
	"context"
	"errors"
	"os"
	"sync"
	"syscall"
	"time"
)

// ErrClosed is returned by Wait after Close.
var ErrClosed = os.ErrClosed

// FD is a non-blocking descriptor registered with the netpoller.
type FD struct {
	file *os.File
	rc   syscall.RawConn

	mu     sync.Mutex // serialises deadline changes
	closed bool
}

// Open makes fd non-blocking and registers a duplicate of it with the
// netpoller. name appears in errors.
func Open(fd int, name string) (*FD, error) {
	return open(fd, name)
}

// Wait calls try until it reports done, sleeping in the netpoller while the
// descriptor is not readable. try must not block (the descriptor is
// non-blocking, so a read of it returns EAGAIN instead). Wait returns the
// context's error when ctx ends first, and ErrClosed after Close.
//
// Deadlines are per descriptor: only one goroutine should wait on an FD at a
// time; callers that need more build a pump on top.
func (p *FD) Wait(ctx context.Context, try func() (done bool)) error {
	if p == nil || p.isClosed() {
		return ErrClosed
	}
	if try() {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if d, ok := ctx.Deadline(); ok {
		if err := p.file.SetReadDeadline(d); err != nil {
			return err
		}
	} else if err := p.file.SetReadDeadline(time.Time{}); err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() {
		// Wake the waiter at once; the loop below reports ctx.Err().
		_ = p.file.SetReadDeadline(time.Unix(1, 0))
	})
	defer stop()
	err := p.rc.Read(func(uintptr) bool { return try() })
	if err == nil {
		return nil
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		return context.DeadlineExceeded
	}
	if p.isClosed() {
		return ErrClosed
	}
	return err
}

func (p *FD) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// Close unregisters the descriptor and wakes every waiter. The C library's
// own descriptor stays open. Close is idempotent.
func (p *FD) Close() error {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	return p.file.Close()
}
