package xrc

import (
	"errors"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/verbs"
)

// failTGTStep fails its process's first TGT creation (step "create") or
// the first move of a TGT it made to RTS (step "rts") with the error a
// device gives.
type failTGTStep struct {
	wrapper
	step  string
	tgt   atomic.Uint64 // the TGT made, for step "rts"
	armed atomic.Bool
}

func (k *failTGTStep) CreateTGT(d kernel.XRCD) (kernel.QP, uint32, error) {
	if k.step == "create" && k.armed.CompareAndSwap(true, false) {
		return 0, 0, &verbs.OpError{Op: "ibv_create_qp_ex", Err: syscall.ENOMEM}
	}
	qp, n, err := k.Kernel.CreateTGT(d)
	if err == nil {
		k.tgt.CompareAndSwap(0, uint64(qp))
	}
	return qp, n, err
}

func (k *failTGTStep) TransitionQP(q kernel.QP, to verbs.QPState, via kernel.ID) error {
	if k.step == "rts" && uint64(q) == k.tgt.Load() && to == verbs.QPStateRTS && k.armed.CompareAndSwap(true, false) {
		return &verbs.OpError{Op: "ibv_modify_qp", Err: syscall.EINVAL}
	}
	return k.Kernel.TransitionQP(q, to, via)
}

// A dial whose reverse leg this endpoint refused for its own kernel's
// failure (the acceptor's reciprocal PHYS_REQ: a TGT not made, or not
// moved to RTS) says which call failed, as the kernel's error does: it said
// only the errno the REJECT carries ("... reverse leg: BUSY_RETRY: invalid
// argument"), which a reader cannot tell from another call's
// (TestErrorAnywhere's TransitionQP/2 found it).
func TestDialReverseRefusedNamesKernelCall(t *testing.T) {
	for _, c := range []struct {
		step, call string
		errno      syscall.Errno
	}{{"create", "ibv_create_qp_ex", syscall.ENOMEM}, {"rts", "ibv_modify_qp", syscall.EINVAL}} {
		t.Run(c.step, func(t *testing.T) {
			w := newWorld(t)
			g := &failTGTStep{step: c.step}
			a := w.wrappedEndpoint("10.0.99.1", 7000, func(k kernel.Kernel) kernel.Kernel { g.Kernel = k; return g })
			b := w.endpoint("10.0.99.2", 7000)
			g.armed.Store(true) // a makes no TGT but for b's reciprocal PHYS_REQ
			conn, err := a.Dial(ctxT(t, testHandshake), b.Addr().String())
			if err == nil {
				conn.Close()
				t.Fatal("dial succeeded, though its reverse leg was refused")
			}
			if g.armed.Load() {
				t.Fatal("setup: the TGT step was not reached")
			}
			if !errors.Is(err, errReverseRefused) || !errors.Is(err, c.errno) || !strings.Contains(err.Error(), c.call) {
				t.Fatalf("dial: %v; want its reverse leg refused, naming %s (%v)", err, c.call, c.errno)
			}
			var oe *verbs.OpError
			if !errors.As(err, &oe) || oe.Op != c.call {
				t.Fatalf("dial: %v: no *verbs.OpError for %s in the chain", err, c.call)
			}
			requireReleased(t, w, a, b)
		})
	}
}
