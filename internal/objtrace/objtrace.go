// Package objtrace counts a process's live C objects by kind and, while
// tracing is on, remembers the stack that created each one, so that a leak
// check can say where a leaked queue pair or CM id came from instead of
// only how many there are (cilium/ebpf traces its file descriptors so).
//
// Tracing is off unless Enable is called or GOXRC_TRACE_OBJECTS is set in
// the environment; off, counting costs one atomic add and one atomic load
// per object created or destroyed.
package objtrace

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// EnvVar turns tracing on at start-up when set to anything but "" or "0".
const EnvVar = "GOXRC_TRACE_OBJECTS"

var (
	tracing atomic.Bool
	mu      sync.Mutex
	traced  map[any]record // guarded by mu
)

type record struct {
	kind string
	pcs  []uintptr
}

func init() {
	if v := os.Getenv(EnvVar); v != "" && v != "0" {
		Enable()
	}
}

// Enable starts recording where objects are created. Objects created
// before are still counted, but a report cannot say where they came from.
func Enable() {
	mu.Lock()
	if traced == nil {
		traced = make(map[any]record)
	}
	mu.Unlock()
	tracing.Store(true)
}

// Enabled reports whether creations are being recorded.
func Enabled() bool { return tracing.Load() }

// Counter counts the live objects of one kind.
type Counter struct {
	Kind string
	n    atomic.Int64
}

// Created counts obj, a pointer that identifies the object until
// Destroyed, and records the caller's stack while tracing.
func (c *Counter) Created(obj any) {
	c.n.Add(1)
	if !tracing.Load() {
		return
	}
	pcs := make([]uintptr, 32)
	pcs = pcs[:runtime.Callers(2, pcs)]
	mu.Lock()
	traced[obj] = record{kind: c.Kind, pcs: pcs}
	mu.Unlock()
}

// Destroyed uncounts obj.
func (c *Counter) Destroyed(obj any) {
	c.n.Add(-1)
	if !tracing.Load() {
		return
	}
	mu.Lock()
	delete(traced, obj)
	mu.Unlock()
}

// Load returns how many objects of the kind are live.
func (c *Counter) Load() int64 { return c.n.Load() }

// Report describes every live object whose creation was recorded, grouped
// by kind and creating stack ("2 QP created at\n\tpkg.Func file:line ..."),
// or says that tracing is off.
func Report() string {
	if !tracing.Load() {
		return "object tracing is off (set " + EnvVar + "=1 to see where leaked objects were created)"
	}
	mu.Lock()
	groups := make(map[string]int)
	for _, r := range traced {
		groups[r.kind+" created at\n"+stack(r.pcs)]++
	}
	mu.Unlock()
	if len(groups) == 0 {
		return "no traced object is live"
	}
	keys := make([]string, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%d %s", groups[k], k)
	}
	return b.String()
}

// stack formats pcs one frame a line, leaving out the runtime's and
// testing's own frames.
func stack(pcs []uintptr) string {
	var b strings.Builder
	frames := runtime.CallersFrames(pcs)
	for {
		f, more := frames.Next()
		if !strings.HasPrefix(f.Function, "runtime.") && !strings.HasPrefix(f.Function, "testing.") {
			fmt.Fprintf(&b, "\t%s %s:%d\n", f.Function, f.File, f.Line)
		}
		if !more {
			return b.String()
		}
	}
}
