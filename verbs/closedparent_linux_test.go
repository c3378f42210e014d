//go:build linux && cgo

package verbs

import (
	"errors"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A closed Context or PD creates nothing: Context.CreateXRCRecvQP,
// Context.OpenQP and PD.CreateQP of an XRC_RECV QP fail with ErrClosed
// before any C call, as every other method of a closed object does (the
// package doc's promise). They checked only the XRC domain, which another
// open wrapper of the same C context (rdmacm.ID.VerbsContext hands out one per
// call) may own, and went on to create a QP, or open a handle, whose
// Context is the closed wrapper. The objects are stand-ins on a zeroed
// page outside the Go heap: libibverbs, if reached, finds no create_qp_ex
// or open_qp there and says EOPNOTSUPP instead of crashing.
func TestClosedContextOrPDCreatesNothing(t *testing.T) {
	page, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(page)
	cctx := (*_Ctype_struct_ibv_context)(unsafe.Pointer(&page[0]))
	// Two wrappers of one C context: closed is closed, open owns the domain.
	closed := &Context{ctx: cctx, name: "fake", reg: &registry{}}
	closed.l.closed = true
	open := &Context{ctx: cctx, name: "fake", reg: &registry{}}
	xrcd := &XRCD{c: open, x: (*_Ctype_struct_ibv_xrcd)(unsafe.Pointer(&page[1024])), tag: "fake xrcd"}
	closedPD := &PD{c: open, pd: (*_Ctype_struct_ibv_pd)(unsafe.Pointer(&page[2048])), tag: "fake pd"}
	closedPD.l.closed = true

	for name, call := range map[string]func() (*QP, error){
		"Context.CreateXRCRecvQP": func() (*QP, error) { return closed.CreateXRCRecvQP(xrcd) },
		"Context.OpenQP":          func() (*QP, error) { return closed.OpenQP(xrcd, 0x123) },
		"PD.CreateQP(XRC_RECV)": func() (*QP, error) {
			return closedPD.CreateQP(QPInit{Type: QPTypeXRCRecv, XRCD: xrcd})
		},
	} {
		q, err := call()
		if q != nil || !errors.Is(err, ErrClosed) {
			t.Errorf("%s of a closed object: %v, %v; want ErrClosed before any C call", name, q, err)
		}
		if n := xrcd.l.refs.Load(); n != 0 {
			t.Errorf("%s left %d reference(s) on the XRC domain", name, n)
			xrcd.l.refs.Store(0)
		}
	}
	// The same calls on the open wrapper still reach libibverbs (here:
	// EOPNOTSUPP from the stand-in context), so the check is the closed
	// state, not the stand-ins.
	if _, err := open.CreateXRCRecvQP(xrcd); errors.Is(err, ErrClosed) || !errors.Is(err, ErrNotSupported) {
		t.Errorf("CreateXRCRecvQP of the open wrapper: %v, want the stand-in's EOPNOTSUPP", err)
	}
	if _, err := open.OpenQP(xrcd, 0x123); errors.Is(err, ErrClosed) || !errors.Is(err, ErrNotSupported) {
		t.Errorf("OpenQP of the open wrapper: %v, want the stand-in's EOPNOTSUPP", err)
	}
}
