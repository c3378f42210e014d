package verbs

import (
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
)

// lifecycle guards one object's C handle. Operations hold the read lock while
// they use the handle, so Close (write lock) never frees it under them.
// Objects that depend on this one take a reference (ref); Close refuses with
// EBUSY while references remain, which rules out double frees and
// use-after-free in C whatever order callers close things in.
type lifecycle struct {
	mu     sync.RWMutex
	closed bool
	refs   atomic.Int64
}

// use read-locks the object; it returns false (and holds nothing) if the
// object is closed.
func (l *lifecycle) use() bool {
	l.mu.RLock()
	if l.closed {
		l.mu.RUnlock()
		return false
	}
	return true
}

func (l *lifecycle) done() { l.mu.RUnlock() }

// tryUse is use without waiting: it also returns false while a Close is
// waiting for the object. A caller that already holds another object's use
// takes this one so: two such callers taking the same two objects in
// opposite orders, each object's Close waiting behind one of them, would
// otherwise block each other for good.
func (l *lifecycle) tryUse() bool {
	if !l.mu.TryRLock() {
		return false
	}
	if l.closed {
		l.mu.RUnlock()
		return false
	}
	return true
}

// ref records a dependent object; false if this one is closed.
func (l *lifecycle) ref() bool {
	if !l.use() {
		return false
	}
	l.refs.Add(1)
	l.done()
	return true
}

func (l *lifecycle) unref() { l.refs.Add(-1) }

// beginClose write-locks the object for Close. It reports already=true when
// the object was closed before (Close is idempotent), and an EBUSY error when
// dependents are still open. On ok the caller must call endClose.
func (l *lifecycle) beginClose(op, addr, what string) (already bool, err error) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return true, nil
	}
	if n := l.refs.Load(); n > 0 {
		l.mu.Unlock()
		return false, &OpError{Op: op, Addr: addr, Err: &explained{syscall.EBUSY,
			fmt.Sprintf("%d dependent object(s) still open; close the %s first", n, what)}}
	}
	return false, nil
}

// endClose marks the object closed (if the C destroy succeeded) and unlocks.
func (l *lifecycle) endClose(ok bool) {
	if ok {
		l.closed = true
	}
	l.mu.Unlock()
}

// explained is an errno with a sentence that says what it means here.
// errors.Is and errors.As still see the errno.
type explained struct {
	errno syscall.Errno
	why   string
}

func (e *explained) Error() string { return e.why + " (" + e.errno.Error() + ")" }
func (e *explained) Unwrap() error { return e.errno }

func closedErr(op, addr string) error { return &OpError{Op: op, Addr: addr, Err: ErrClosed} }
