//go:build !linux || !cgo

package rdmacm

import (
	"net/netip"
	"unsafe"

	"github.com/goxrc/goxrc/verbs"
)

// Without Linux and cgo there is no librdmacm: NewEventChannel fails with
// ErrNotSupported, so no ID ever exists and the functions below are never
// reached with a live object.

type chanSys struct{}

type idSys struct{}

func (c *EventChannel) sysOpen() error {
	return &verbs.OpError{Op: "rdma_create_event_channel", Err: ErrNotSupported}
}

func (c *EventChannel) sysStop()    {}
func (c *EventChannel) sysDestroy() {}

func (id *ID) sysCreate() error                                { return ErrNotSupported }
func (id *ID) sysCreateEP(netip.AddrPort) error                { return ErrNotSupported }
func (id *ID) sysBind(netip.AddrPort) error                    { return ErrNotSupported }
func (id *ID) sysResolveAddr(_, _ netip.AddrPort, _ int) error { return ErrNotSupported }
func (id *ID) sysResolveRoute(int) error                       { return ErrNotSupported }
func (id *ID) sysListen(int32) error                           { return ErrNotSupported }
func (id *ID) sysConnect(*ConnParam) error                     { return ErrNotSupported }
func (id *ID) sysAccept(*ConnParam) error                      { return ErrNotSupported }
func (id *ID) sysReject([]byte) error                          { return ErrNotSupported }
func (id *ID) sysEstablish() error                             { return ErrNotSupported }
func (id *ID) sysDisconnect() error                            { return ErrNotSupported }
func (id *ID) sysDestroy() error                               { return nil }
func (id *ID) sysDeviceName() string                           { return "" }
func (id *ID) sysPort() uint8                                  { return 0 }
func (id *ID) sysLocalAddr() netip.AddrPort                    { return netip.AddrPort{} }
func (id *ID) sysRemoteAddr() netip.AddrPort                   { return netip.AddrPort{} }
func (id *ID) sysVerbs() unsafe.Pointer                        { return nil }

func (id *ID) sysMoveQP(unsafe.Pointer, verbs.QPState, verbs.QPState, MoveParams) (int, string, error) {
	return -1, "rdma_init_qp_attr", ErrNotSupported
}

func (id *ID) sysInitQPAttr(verbs.QPState) (verbs.QPAttr, verbs.QPAttrMask, error) {
	return verbs.QPAttr{}, 0, ErrNotSupported
}
