package cm_test

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"testing"

	"github.com/goxrc/goxrc/cm"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// An address that does not parse is an argument the call cannot take: it
// matches ErrInvalid, as the package doc says and as xrc's do, and stays
// the *net.AddrError package net gives (it matched no ErrInvalid).
func TestUnparsableAddrInvalid(t *testing.T) {
	ctx := context.Background()
	f := memfabric.New()
	p := f.Node("10.1.9.1").Process()
	defer p.Kill()
	o := []cm.Option{cm.WithFabric(p), cm.WithDomainPath(t.TempDir())}
	for _, address := range []string{"nonsense", "10.1.9.1", "10.1.9.1:", "10.1.9.1:99999", "[10.1.9.1:7000"} {
		_, derr := cm.Dial(ctx, address, o...)
		l, lerr := cm.Listen(ctx, address, o...)
		if l != nil {
			l.Close()
		}
		for op, err := range map[string]error{"dial": derr, "listen": lerr} {
			var ae *net.AddrError
			if !errors.Is(err, cm.ErrInvalid) || !errors.As(err, &ae) {
				t.Errorf("%s %q: %v, want a *net.AddrError matching ErrInvalid", op, address, err)
			}
		}
	}
}

// The unspecified address names no peer: net.Dial takes it for the local
// system, but no RDMA device sits on the loopback. It was EHOSTUNREACH on
// the fabric and ENODEV from a device's rdma_resolve_route; now it is
// refused alike before anything is tried (a device's check:
// TestCMDialUnspecifiedInvalid).
func TestDialUnspecifiedInvalid(t *testing.T) {
	ctx := context.Background()
	f := memfabric.New()
	p := f.Node("10.1.9.1").Process()
	defer p.Kill()
	o := []cm.Option{cm.WithFabric(p), cm.WithDomainPath(filepath.Join(t.TempDir(), "xrc"))}
	l, err := cm.Listen(ctx, "10.1.9.1:7000", o...)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, address := range []string{"0.0.0.0:7000", ":7000", "[::]:7000", "[::%eth0]:7000", "[::%1]:7000"} {
		c, err := cm.Dial(ctx, address, o...)
		if err == nil {
			c.Close()
		}
		if !errors.Is(err, cm.ErrInvalid) {
			t.Errorf("dial %q: %v, want an error matching ErrInvalid", address, err)
		}
	}
}
