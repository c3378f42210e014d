//go:build linux && cgo

package kcm

import (
	"context"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/test/softroce"
)

// TestConnectFromOwnAddress: a CM whose address is the second of a device
// connects, by both exchanges, to a listener on the first; the listener must
// see the request come from the second. Resolving from the wildcard, the
// kernel took the destination's own address as the source (a local route).
// Runs in the VM of test/vm/rxe-vm.sh; skips elsewhere.
func TestConnectFromOwnAddress(t *testing.T) {
	dev := os.Getenv(softroce.EnvDev)
	if dev == "" {
		t.Skip("RXE_DEV unset: run through test/vm/rxe-vm.sh")
	}
	ip1, err := netip.ParseAddr(os.Getenv(softroce.EnvIP))
	if err != nil {
		t.Fatalf("RXE_IP: %v", err)
	}
	ip2 := softroce.SecondAddress(t, dev, ip1)
	srv, err := New(ip1)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	cli, err := New(ip2)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	for i, ex := range []kernel.Exchange{kernel.ExchangeSIDR, kernel.ExchangeXRC} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		dst := netip.AddrPortFrom(ip1, uint16(20341+i))
		l, err := srv.Listen(dst, ex)
		if err != nil {
			t.Fatal(err)
		}
		c, err := cli.Connect(ctx, dst, ex, 0x7ABCDE, []byte("hello"))
		if err != nil {
			t.Fatalf("%v: connect: %v", ex, err)
		}
		ev, err := srv.Event(ctx, l)
		if err != nil || ev.Type != kernel.EventConnectRequest {
			t.Fatalf("%v: listener event %+v, %v", ex, ev, err)
		}
		if ev.Remote.Addr() != ip2 {
			t.Errorf("%v: the request came from %v, want %v", ex, ev.Remote.Addr(), ip2)
		}
		srv.Reject(ev.ID, nil)
		// A rejected SIDR REQ reads as unreachable (its REP's status).
		if ev, err := cli.Event(ctx, c); err != nil || (ev.Type != kernel.EventRejected && ev.Type != kernel.EventUnreachable) {
			t.Errorf("%v: connecting id's event %+v, %v; want the reject", ex, ev, err)
		}
		srv.DestroyID(ev.ID)
		cli.DestroyID(c)
		srv.DestroyID(l)
		cancel()
	}
}
