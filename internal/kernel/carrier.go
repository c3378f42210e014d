package kernel

import "sync"

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
