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

	// The waiter's state, bound once so that Wait does not allocate.
	try        func() bool
	readFn     func(uintptr) bool
	deadlineOn bool // a read deadline may be set from an earlier Wait

	mu      sync.Mutex // serialises deadline changes and guards what follows
	closed  bool       // Close was called
	waiters int        // Waits inside rc.Read: the last one out releases file after Close

	// The cancellation wake-up (armCancel) stays registered between Waits
	// on the same context, so that a waiter that sleeps once per message
	// does not allocate a registration each time. Contexts are told apart
	// by their Done channel: one Done ends them all at once. One with a
	// deadline is let go of as its Wait returns: it is most likely made
	// per call, and a registration kept would run (a goroutine) as it ends.
	armedDone <-chan struct{} // the Done the registration is for
	stopArmed func() bool     // unregisters it (Close, another context, a deadline)
	keepArmed bool            // the context has no deadline
	waitDone  <-chan struct{} // the Done of the Wait that may sleep now, else nil

	testCancelled func() // tests: runs after each cancellation wake-up
}

// Open makes fd non-blocking and registers a duplicate of it with the
// netpoller. name appears in errors.
func Open(fd int, name string) (*FD, error) {
	p, err := open(fd, name)
	if err != nil {
		return nil, err
	}
	p.readFn = func(uintptr) bool { return p.try() }
	return p, nil
}

// Wait calls try until it reports done, sleeping in the netpoller while the
// descriptor is not readable. try must not block (the descriptor is
// non-blocking, so a read of it returns EAGAIN instead). Wait returns the
// context's error when ctx ends first, and ErrClosed after Close. With a
// context that can never end it does not allocate, nor with one that can
// after its first sleep on this FD (until a Wait with another context).
//
// Only one goroutine may wait on an FD at a time (deadlines are per
// descriptor); callers that need more build a pump on top.
//
// try may call Close: Close never waits for try, so this does not deadlock,
// and the Wait then returns ErrClosed (nil if that try reported done). A
// Close from elsewhere does not wait for a running try either; see Close
// for when the descriptor is released.
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
			return p.closedOr(err)
		}
		p.deadlineOn = true
	} else if p.deadlineOn {
		if err := p.file.SetReadDeadline(time.Time{}); err != nil {
			return p.closedOr(err)
		}
		p.deadlineOn = false
	}
	if ctx.Done() != nil {
		p.armCancel(ctx)
		defer p.disarmCancel()
	}
	// From here until it leaves rc.Read, a Close leaves the release of the
	// file to this Wait: os.File.Close would wait for rc.Read, and so for
	// try, which may be the caller of Close.
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return ErrClosed
	}
	p.waiters++
	p.mu.Unlock()
	err, closed := p.read(try)
	if err == nil {
		return nil
	}
	if closed {
		return ErrClosed // woken by Close's deadline in the past, or evicted
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		if cerr := ctx.Err(); cerr != nil {
			return cerr
		}
		return context.DeadlineExceeded
	}
	return p.closedOr(err)
}

// read runs try in the netpoller, and leaves it: a try that panics does
// not leave the waiter counted (Close would leave the release to a Wait that
// is gone).
func (p *FD) read(try func() bool) (err error, closed bool) {
	defer func() {
		p.try = nil
		p.mu.Lock()
		p.waiters--
		closed = p.closed
		release := closed && p.waiters == 0
		p.mu.Unlock()
		if release {
			// Close came while this Wait was in rc.Read; nothing holds
			// the file now, so this does not block.
			_ = p.file.Close()
		}
	}()
	p.try = try
	return p.rc.Read(p.readFn), false
}

// closedOr is ErrClosed once Close has begun (the os.File's own errors for
// a descriptor closed under a call read "use of closed file"), else err.
func (p *FD) closedOr(err error) error {
	if p.isClosed() {
		return ErrClosed
	}
	return err
}

// armCancel makes ctx's end wake the waiter at once (a read deadline in
// the past); Wait then reports ctx.Err(). disarmCancel undoes it, and a
// wake-up that fires late, for an earlier Wait, does nothing.
func (p *FD) armCancel(ctx context.Context) {
	done := ctx.Done()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.deadlineOn = true
	p.waitDone = done
	if p.closed {
		return
	}
	if p.armedDone != done {
		if p.stopArmed != nil {
			p.stopArmed()
		}
		p.armedDone = done
		p.stopArmed = context.AfterFunc(ctx, func() { p.cancelled(done) })
		_, timed := ctx.Deadline()
		p.keepArmed = !timed
	}
	// A registration kept from an earlier Wait fired then, if ctx ended
	// between that Wait and this one's look at ctx.Err().
	if ctx.Err() != nil {
		_ = p.file.SetReadDeadline(time.Unix(1, 0))
	}
}

func (p *FD) cancelled(done <-chan struct{}) {
	p.mu.Lock()
	if p.waitDone == done && !p.closed {
		_ = p.file.SetReadDeadline(time.Unix(1, 0))
	}
	hook := p.testCancelled
	p.mu.Unlock()
	if hook != nil {
		hook()
	}
}

func (p *FD) disarmCancel() {
	p.mu.Lock()
	p.waitDone = nil
	if !p.keepArmed && p.stopArmed != nil {
		p.stopArmed()
		p.stopArmed, p.armedDone = nil, nil
	}
	p.mu.Unlock()
}

func (p *FD) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// Close unregisters the descriptor and wakes every waiter (its Wait returns
// ErrClosed). The C library's own descriptor stays open. Close is
// idempotent, and it never waits for a running try, so try may call it.
//
// The duplicate descriptor is released (closed, and so unregistered from
// the netpoller) by Close itself when no Wait is inside the netpoller;
// otherwise Close wakes that Wait and returns at once, and the Wait releases
// the descriptor as it returns: at once if it was asleep, else as soon as
// its running try returns. Either way exactly one of them closes it. A
// caller that must know no try runs any more (before it frees what try
// reads) waits for its waiter to return, or keeps try out with a flag of
// its own set after Close.
func (p *FD) Close() error {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	if p.stopArmed != nil {
		// The context may outlive the FD: let go of the registration.
		p.stopArmed()
		p.stopArmed, p.armedDone = nil, nil
	}
	if p.waiters > 0 {
		// A deadline in the past wakes the waiter without waiting for its
		// read lock (os.File.Close would wait for it, and so for try);
		// after a try running now returns, the wait returns at once. No
		// other deadline is set after closed: Wait sets its own before it
		// checks closed, and armCancel sets only past ones.
		_ = p.file.SetReadDeadline(time.Unix(1, 0))
		p.mu.Unlock()
		return nil
	}
	p.mu.Unlock()
	// No Wait holds the file: a Wait that starts now sees closed, or fails
	// on the closed file, and returns ErrClosed.
	return p.file.Close()
}
