package verbs

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
)

// ErrNotSupported is returned where the platform, the build (no cgo) or the
// device lacks a feature: no RDMA on this OS, no XRC on soft-RoCE, and so on.
// Test with errors.Is.
var ErrNotSupported = errors.New("not supported")

// ErrClosed is returned by operations on an object after its Close.
var ErrClosed = net.ErrClosed

// OpError describes a failed operation: which call, on which object (device,
// address or QP), and why. Err is usually a syscall.Errno; errors.Is(err,
// ErrNotSupported) holds for EOPNOTSUPP, ENOSYS and EPROTONOSUPPORT,
// errors.Is(err, os.ErrInvalid) for EINVAL, and
// errors.Is(err, os.ErrDeadlineExceeded) for a deadline that passed, a
// context's included (as net.Conn reports them; errors.Is(err,
// context.DeadlineExceeded) holds for those too). Timeout reports those and
// the errors that say timed out themselves, such as ETIMEDOUT. It
// implements net.Error.
type OpError struct {
	Op   string // the C call or library operation, e.g. "ibv_open_xrcd"
	Addr string // device, address or object the operation worked on; may be empty
	Err  error
}

func (e *OpError) Error() string {
	if e.Addr == "" {
		return e.Op + ": " + e.Err.Error()
	}
	return e.Op + " " + e.Addr + ": " + e.Err.Error()
}

// Unwrap returns the underlying error (an errno, or one of the package's
// sentinel errors).
func (e *OpError) Unwrap() error { return e.Err }

// Is makes errno values that mean "not supported" match ErrNotSupported,
// EINVAL os.ErrInvalid (an argument the device cannot take; syscall.Errno
// maps it to no os error), and a context's deadline os.ErrDeadlineExceeded.
func (e *OpError) Is(target error) bool {
	if target == os.ErrDeadlineExceeded {
		return errors.Is(e.Err, context.DeadlineExceeded)
	}
	if target == os.ErrInvalid {
		return errors.Is(e.Err, syscall.EINVAL)
	}
	if target != ErrNotSupported {
		return false
	}
	var errno syscall.Errno
	if errors.As(e.Err, &errno) {
		return errno == syscall.EOPNOTSUPP || errno == syscall.ENOSYS || errno == syscall.EPROTONOSUPPORT
	}
	return false
}

// Timeout reports whether the operation timed out.
func (e *OpError) Timeout() bool {
	if errors.Is(e.Err, os.ErrDeadlineExceeded) {
		return true
	}
	var t interface{ Timeout() bool }
	return errors.As(e.Err, &t) && t.Timeout()
}

// Temporary reports whether retrying may succeed (EAGAIN, EBUSY, ENOMEM,
// timeouts). Deprecated in net.Error; kept for the interface.
func (e *OpError) Temporary() bool {
	var errno syscall.Errno
	if errors.As(e.Err, &errno) {
		return errno.Temporary() || errno == syscall.EBUSY || errno == syscall.ENOMEM
	}
	return e.Timeout()
}

var _ net.Error = (*OpError)(nil)

// CompletionError reports a work completion that finished with an error
// status, such as a remote access error or a flushed request.
type CompletionError struct {
	WRID      uint64
	Status    WCStatus
	VendorErr uint32
	QPNum     uint32
}

func (e *CompletionError) Error() string {
	return fmt.Sprintf("work request %#x on QP %#x completed with %v (vendor error %#x)", e.WRID, e.QPNum, e.Status, e.VendorErr)
}

// Flushed reports whether the request was flushed because its QP entered the
// error state (the connection went away), rather than failing on its own.
func (e *CompletionError) Flushed() bool { return e.Status == WCWRFlushErr }
