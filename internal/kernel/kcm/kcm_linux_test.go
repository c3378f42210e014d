//go:build linux && cgo

package kcm

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/test/softroce"
	"github.com/goxrc/goxrc/verbs"
)

// TestConnectFromOwnAddress: a CM whose address is the second of a device
// connects, by both exchanges, to a listener on the first; the listener must
// see the request come from the second. Resolving from the wildcard, the
// kernel took the destination's own address as the source (a local route).
// Runs in the VM of test/vm/rxe-vm.sh; skips elsewhere.
func TestConnectFromOwnAddress(t *testing.T) {
	ip1 := rxeIP(t)
	dev := os.Getenv(softroce.EnvDev)
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
		l, c, ev := pendingRequest(t, ctx, srv, cli, netip.AddrPortFrom(ip1, uint16(20341+i)), ex)
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

// TestPathOfFollowsTheKernelCM: PathOf gives the peer's path while the
// kernel CM would move a QP (a request received), and EINVAL once it would
// not (the requester destroyed its id, whose REJ ends the request), as
// rdma_init_qp_attr does on the device: the hybrid kernel's TGT could reach
// RTR after the peer was gone. Runs in the VM of test/vm/rxe-vm.sh; skips
// elsewhere.
func TestPathOfFollowsTheKernelCM(t *testing.T) {
	c, ip := rxeCM(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dst := netip.AddrPortFrom(ip, 20353)
	l, err := c.Listen(dst, kernel.ExchangeXRC)
	if err != nil {
		t.Fatal(err)
	}
	a, err := c.Connect(ctx, dst, kernel.ExchangeXRC, 0x7ABCDE, []byte("hello"))
	if err != nil {
		t.Fatal(err)
	}
	ev, err := c.Event(ctx, l)
	if err != nil || ev.Type != kernel.EventConnectRequest {
		t.Fatalf("listener event %+v, %v", ev, err)
	}
	for _, to := range []verbs.QPState{verbs.QPStateInit, verbs.QPStateRTR} {
		if p, err := c.PathOf(ev.ID, to); err != nil || p.RemoteQPN != 0x7ABCDE {
			t.Fatalf("PathOf(%v) with the request received: %+v, %v", to, p, err)
		}
	}
	if err := c.DestroyID(a); err != nil {
		t.Fatal(err)
	}
	// Its REJ reaches the request's id in the kernel (no event comes to
	// the id: rdma_cm reports nothing for a request not yet answered).
	for {
		_, err := c.PathOf(ev.ID, verbs.QPStateRTR)
		if errors.Is(err, syscall.EINVAL) {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("PathOf(RTR) after the requester went: %v, want EINVAL", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	c.DestroyID(ev.ID)
	c.DestroyID(l)
}

// TestEstablishOnlyOnActiveXRC: Establish on a passive id (a request
// received) is refused with EINVAL and sends nothing, as in the model:
// librdmacm's rdma_establish there is an accept, and the requester got
// ESTABLISHED (SIDR) or a REJ (XRC) that no decision had made (found by a
// review). Runs in the VM of test/vm/rxe-vm.sh; skips elsewhere.
func TestEstablishOnlyOnActiveXRC(t *testing.T) {
	cm, ip := rxeCM(t)
	for i, ex := range []kernel.Exchange{kernel.ExchangeSIDR, kernel.ExchangeXRC} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		l, c, ev := pendingRequest(t, ctx, cm, cm, netip.AddrPortFrom(ip, uint16(20361+i)), ex)
		if err := cm.Establish(ev.ID); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("%v: Establish on the passive id: %v, want EINVAL", ex, err)
		}
		cm.Reject(ev.ID, nil)
		if ev, err := cm.Event(ctx, c); err != nil || (ev.Type != kernel.EventRejected && ev.Type != kernel.EventUnreachable) {
			t.Errorf("%v: the requester's event %+v, %v; want our reject, and nothing before it", ex, ev, err)
		}
		cm.DestroyID(ev.ID)
		cm.DestroyID(c)
		cm.DestroyID(l)
		cancel()
	}
}

// pendingRequest has srv listen on dst and cli connect to it by ex, and
// returns the listener, the connecting id and the listener's
// CONNECT_REQUEST (not answered).
func pendingRequest(t *testing.T, ctx context.Context, srv, cli *CM, dst netip.AddrPort, ex kernel.Exchange) (l, c kernel.ID, ev kernel.Event) {
	t.Helper()
	l, err := srv.Listen(dst, ex)
	if err != nil {
		t.Fatal(err)
	}
	if c, err = cli.Connect(ctx, dst, ex, 0x7ABCDE, []byte("hello")); err != nil {
		t.Fatalf("%v: connect: %v", ex, err)
	}
	if ev, err = srv.Event(ctx, l); err != nil || ev.Type != kernel.EventConnectRequest {
		t.Fatalf("%v: listener event %+v, %v", ex, ev, err)
	}
	return l, c, ev
}

// rxeIP is soft-RoCE's address in the VM of test/vm/rxe-vm.sh; it skips
// elsewhere.
func rxeIP(t *testing.T) netip.Addr {
	t.Helper()
	if os.Getenv(softroce.EnvDev) == "" {
		t.Skip("RXE_DEV unset: run through test/vm/rxe-vm.sh")
	}
	ip, err := netip.ParseAddr(os.Getenv(softroce.EnvIP))
	if err != nil {
		t.Fatalf("RXE_IP: %v", err)
	}
	return ip
}

// rxeCM is a CM on soft-RoCE's address, closed at the end of the test.
func rxeCM(t *testing.T) (*CM, netip.Addr) {
	t.Helper()
	ip := rxeIP(t)
	c, err := New(ip)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, ip
}
