package xrc

import (
	"context"
	"errors"
	"testing"

	"github.com/goxrc/goxrc/xrc/memfabric"
)

// An address that does not parse is an argument the call cannot take: a
// Config.Addr, on a device or a fabric process, and Dial's address match
// ErrInvalid as the Config's other mistakes do.
func TestUnparsableAddrInvalid(t *testing.T) {
	ctx := context.Background()
	f := memfabric.New()
	p := f.Node("10.0.12.1").Process()
	for name, cfg := range map[string]Config{
		"device, no port":   {Addr: "10.0.11.1"},
		"fabric, no port":   {Process: p, Addr: "10.0.12.1", DomainDir: t.TempDir() + "/d"},
		"fabric, not an IP": {Process: p, Addr: "node:7000", DomainDir: t.TempDir() + "/d"},
	} {
		if _, err := NewEndpoint(ctx, cfg); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want it to match ErrInvalid", name, err)
		}
	}
	e, err := NewEndpoint(ctx, Config{Process: p, Addr: "10.0.12.1:0", DomainDir: t.TempDir() + "/d"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	if _, err := e.Dial(ctx, "10.0.12.2"); !errors.Is(err, ErrInvalid) {
		t.Errorf("Dial without a port: %v, want it to match ErrInvalid", err)
	}
}
