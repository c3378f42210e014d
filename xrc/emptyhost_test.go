package xrc

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/goxrc/goxrc/xrc/memfabric"
)

// A Config.Addr with an empty ip (":7000") is 0.0.0.0's, as for net.Listen
// and cm.Listen: on a fabric process the node's address, on a device without
// Config.Device the unspecified address's error. It failed to parse ("no
// IP") where "0.0.0.0:7000" worked.
func TestEndpointEmptyHostIsUnspecified(t *testing.T) {
	p := memfabric.New().Node("10.0.12.5").Process()
	defer p.Kill()
	e, err := NewEndpoint(context.Background(), Config{Process: p, Addr: ":7000", DomainDir: t.TempDir() + "/d"})
	if err != nil {
		t.Fatalf(":7000 on a fabric process: %v", err)
	}
	defer e.Close()
	if want := netip.AddrPortFrom(p.Node().Addr(), 7000); e.Addr() != want {
		t.Errorf(":7000 listens on %v, want %v", e.Addr(), want)
	}
	_, err = NewEndpoint(context.Background(), Config{Addr: ":0"})
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "needs a concrete IP") {
		t.Errorf(":0 on a device without Device: %v, want the unspecified address's error", err)
	}
	if _, err := NewEndpoint(context.Background(), Config{Process: p, Addr: ":x", DomainDir: t.TempDir() + "/d"}); !errors.Is(err, ErrInvalid) {
		t.Errorf(":x: %v, want it to match ErrInvalid", err)
	}
}
