//go:build linux && cgo

package verbs

import (
	"errors"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// CreateXRCSRQ refuses an XRC domain or a CQ that was never opened (a zero
// value: no C handle) with ErrClosed before any C call, as CreateQP and
// OpenQP do: the NULL handle would reach the provider, and mlx5's
// ibv_cmd_create_srq_ex reads the domain's and the CQ's handles through it.
// The PD here is a stand-in whose C pointers name a zeroed page outside the
// Go heap, so the test runs without a device: libibverbs, reached, finds
// no create_srq_ex there and says EOPNOTSUPP instead of crashing.
func TestCreateXRCSRQRefusesUnopenedObjects(t *testing.T) {
	page, err := unix.Mmap(-1, 0, 4096, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(page)
	c := &Context{ctx: (*_Ctype_struct_ibv_context)(unsafe.Pointer(&page[0])), name: "fake", reg: &registry{}}
	pd := &PD{c: c, pd: (*_Ctype_struct_ibv_pd)(unsafe.Pointer(&page[2048])), tag: "fake pd"}
	xrcd := &XRCD{c: c, x: (*_Ctype_struct_ibv_xrcd)(unsafe.Pointer(&page[1024])), tag: "fake xrcd"}
	cq := &CQ{c: c, cq: (*_Ctype_struct_ibv_cq)(unsafe.Pointer(&page[3072])), tag: "fake cq"}
	for _, tc := range []struct {
		name string
		xrcd *XRCD
		cq   *CQ
	}{
		{"zero XRCD", new(XRCD), cq},
		{"zero CQ", xrcd, new(CQ)},
	} {
		_, err := pd.CreateXRCSRQ(tc.xrcd, tc.cq, SRQInit{MaxWR: 1, MaxSGE: 1})
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s: %v, want ErrClosed before any C call", tc.name, err)
		}
	}
	for _, l := range []*lifecycle{&pd.l, &xrcd.l, &cq.l} {
		if n := l.refs.Load(); n != 0 {
			t.Errorf("%d references left behind", n)
		}
	}
}
