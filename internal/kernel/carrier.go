package kernel

import (
	"net/netip"
	"sync"
	"sync/atomic"
)

// Exported packages of this module carry a Kernel in opaque values (a
// memfabric.Process) without showing it to users: the package that makes the
// value registers an unwrapper, and the engine (xrc, cm) calls Unwrap. Users
// cannot import this package, so they can neither name nor extract the Kernel.

var (
	unwrapMu  sync.RWMutex
	unwrapper []func(v any) (Kernel, bool)
)

// RegisterUnwrapper adds f, which returns the Kernel carried by v if v is one
// of its package's opaque values. Call it from an init function.
func RegisterUnwrapper(f func(v any) (Kernel, bool)) {
	unwrapMu.Lock()
	defer unwrapMu.Unlock()
	unwrapper = append(unwrapper, f)
}

// Unwrap returns the Kernel carried by v.
func Unwrap(v any) (Kernel, bool) {
	if v == nil {
		return nil, false
	}
	unwrapMu.RLock()
	defer unwrapMu.RUnlock()
	for _, f := range unwrapper {
		if k, ok := f(v); ok && k != nil {
			return k, true
		}
	}
	return nil, false
}

// Carry wraps k in an opaque value that Unwrap takes apart (package
// memfabric sets it: the value is a *memfabric.Process). Only tests use it,
// with DeviceKernel.
var Carry func(k Kernel) any

// DeviceKernel, when a test sets it, is asked first for the kernel that the
// XRC connections of a device run on (package cm's XRC modes): it returns a
// Carry of that kernel, or nil for the device's own verbs. The VM's tests
// set it to run cm's XRC modes with the real kernel CM on soft-RoCE, whose
// verbs have no XRC (internal/kernel/hybrid).
var DeviceKernel atomic.Pointer[func(device string, local netip.Addr) any]
