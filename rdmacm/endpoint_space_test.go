package rdmacm

import (
	"context"
	"errors"
	"net/netip"
	"testing"

	"github.com/goxrc/goxrc/verbs"
)

// CreateEndpoint refuses, before any C call, a port space whose kernel QP
// type is not the id's, as CreateID does: the kernel makes a TCP id RC and
// a UDP or IPoIB id UD whatever QP type librdmacm records, and librdmacm
// (and this package) then read each event's parameters as the recorded
// type's (a UD id's as a SIDR exchange's, a connected one's as a REQ's)
// while the kernel filled them as the other's; an XRC id on TCP exchanges
// as RC, which the peer's XRC target rejects.
func TestCreateEndpointPortSpaceValidation(t *testing.T) {
	c := &EventChannel{ids: map[uintptr]*ID{}}
	addr := netip.MustParseAddrPort("10.0.0.1:1")
	for _, bad := range []struct {
		ps PortSpace
		qt verbs.QPType
	}{
		{PortSpaceTCP, verbs.QPTypeUD}, {PortSpaceUDP, verbs.QPTypeRC}, {PortSpaceIPoIB, verbs.QPTypeRC},
		{PortSpaceTCP, verbs.QPTypeXRCSend}, {PortSpaceUDP, verbs.QPTypeXRCRecv}, {7, verbs.QPTypeRC},
	} {
		for _, passive := range []bool{true, false} {
			ctx, cancel := context.WithCancel(context.Background())
			cancel() // an active endpoint that got through would not wait
			_, err := c.CreateEndpoint(ctx, bad.ps, bad.qt, addr, passive)
			var oe *verbs.OpError
			if !errors.As(err, &oe) || oe.Addr != bad.ps.String()+"/"+bad.qt.String() {
				t.Errorf("%v/%v (passive %v): %v, want a refusal naming the port space and QP type", bad.ps, bad.qt, passive, err)
			}
		}
	}
	if n := Counts().IDs; n != 0 {
		t.Errorf("%d ids left", n)
	}
}
