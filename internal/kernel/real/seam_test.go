//go:build linux && cgo

package real

import (
	"errors"
	"syscall"
	"testing"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/verbs"
)

// fakeINI is a Process holding one INI in RTS with no verbs objects behind
// it: enough for the paths of PostSend that decide before any C call.
func fakeINI() (*Process, kernel.QP) {
	p := &Process{objs: map[uint64]any{}}
	h, _ := p.add(&qpObj{typ: verbs.QPTypeXRCSend, rts: true, ring: sendRing{size: 1 << 10}})
	return p, kernel.QP(h)
}

// An empty chain posts nothing and is no error, as in the model (its loop
// over no requests) and verbs.QP.PostSend: ENOMEM says the send queue is
// full until completions are polled, and a caller that believed it would
// wait for room with nothing in flight.
func TestPostSendEmptyChain(t *testing.T) {
	p, q := fakeINI()
	if err := p.PostSend(q, nil); err != nil {
		t.Fatalf("PostSend of an empty chain on an RTS INI: %v, want nil (full queue: %v)", err, errors.Is(err, syscall.ENOMEM))
	}
}
