// Package faults makes C calls of the bindings fail on demand, for tests
// only: no device or kernel fails a destroy when asked, and what a failed
// one leaves behind must still be tested. Nothing outside tests sets these;
// unset, each costs the bindings one atomic load.
package faults

import "sync/atomic"

// Hook, when set, is asked before a C call is made; a non-nil error fails
// the call with it, and the C call is not made.
type Hook = func(op string) error

var hook atomic.Pointer[Hook]

// Set installs h (nil removes it) and returns a function that removes it.
func Set(h Hook) (unset func()) {
	if h == nil {
		hook.Store(nil)
		return func() {}
	}
	p := &h
	hook.Store(p)
	// Only its own: a hook set since stays (one cleared by an earlier
	// test's cleanup would let a fault test pass with no fault).
	return func() { hook.CompareAndSwap(p, nil) }
}

// Check is the hook's verdict on op ("rdma_destroy_id", "ibv_destroy_cq",
// ...): nil when no hook is set.
func Check(op string) error {
	if h := hook.Load(); h != nil {
		return (*h)(op)
	}
	return nil
}

// FailOnce returns a hook that fails the next call named op with err, then
// passes everything.
func FailOnce(op string, err error) Hook {
	var done atomic.Bool
	return func(o string) error {
		if o == op && done.CompareAndSwap(false, true) {
			return err
		}
		return nil
	}
}
