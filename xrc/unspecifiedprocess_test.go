package xrc

import (
	"context"
	"net/netip"
	"testing"

	"github.com/goxrc/goxrc/xrc/memfabric"
)

// On a fabric process an unspecified Config.Addr is the node's address, as
// on a device with Config.Device; only a device endpoint without Device
// fails with ErrInvalid (the documentation said any endpoint did).
func TestEndpointUnspecifiedOnProcess(t *testing.T) {
	p := memfabric.New().Node("10.0.12.1").Process()
	defer p.Kill()
	for _, addr := range []string{"0.0.0.0:7000", "[::]:7001"} {
		e, err := NewEndpoint(context.Background(), Config{Process: p, Addr: addr, DomainDir: t.TempDir() + "/d"})
		if err != nil {
			t.Fatalf("%s: %v", addr, err)
		}
		if want := netip.MustParseAddrPort(addr); e.Addr() != netip.AddrPortFrom(p.Node().Addr(), want.Port()) {
			t.Errorf("%s: listens on %v, want the node's address", addr, e.Addr())
		}
		e.Close()
	}
}
