package xrc

import (
	"context"
	"net/netip"
	"testing"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// Config.Addr's port 0 picks a free port, however few are left: with all
// but one of the range taken on the node, the endpoint gets that one. It
// tried 51 ports at random and gave up (EADDRINUSE), as a fabric demo of
// some 20,000 processes on one node did.
func TestFreePortFoundAmongFew(t *testing.T) {
	ctx := context.Background()
	n := memfabric.New().Node("10.0.13.1")
	holder, _ := kernel.Unwrap(n.Process())
	ip := netip.MustParseAddr("10.0.13.1")
	const free = freePortFirst + 12345
	for port := freePortFirst; port < freePortFirst+freePorts; port++ {
		if port == free {
			continue
		}
		if _, err := holder.Listen(netip.AddrPortFrom(ip, uint16(port)), kernel.ExchangeSIDR); err != nil {
			t.Fatal(err)
		}
	}
	e, err := NewEndpoint(ctx, Config{Process: n.Process(), Addr: "10.0.13.1:0", DomainDir: t.TempDir() + "/d"})
	if err != nil {
		t.Fatalf("port 0 with one port free: %v", err)
	}
	defer e.Close()
	if got := e.Addr().Port(); got != free {
		t.Errorf("port %d, want the free %d", got, free)
	}
	// None left: a clear EADDRINUSE, after the whole range.
	if _, err := holder.Listen(netip.AddrPortFrom(ip, free), kernel.ExchangeXRC); err == nil {
		t.Fatal("the endpoint's port was free to another listener")
	}
	_, err = NewEndpoint(ctx, Config{Process: n.Process(), Addr: "10.0.13.1:0", DomainDir: t.TempDir() + "/d"})
	if err == nil {
		t.Fatal("port 0 with no port free: no error")
	}
}
