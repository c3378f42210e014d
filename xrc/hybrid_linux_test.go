//go:build linux && cgo

package xrc

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel/hybrid"
	"github.com/goxrc/goxrc/internal/kernel/model"
)

// The engine on the real CM: internal/kernel/hybrid carries the physical
// (XRC-typed) and virtual (SIDR) exchanges through the kernel's RDMA CM on
// soft-RoCE, the QPs and the data path are the model's. Runs in the VM of
// test/vm/rxe-vm.sh (RXE_DEV, RXE_IP); skips elsewhere. Ports 20311-20319.

var hybridFabric = sync.OnceValue(func() *hybrid.Fabric { return hybrid.NewFabric(model.ReuseNever) })

func hybridEndpoint(t *testing.T, port uint16, dir string) (*Endpoint, *hybrid.Process) {
	t.Helper()
	if os.Getenv("RXE_DEV") == "" {
		t.Skip("RXE_DEV unset: run through test/vm/rxe-vm.sh")
	}
	ip, err := netip.ParseAddr(os.Getenv("RXE_IP"))
	if err != nil {
		t.Fatalf("RXE_IP: %v", err)
	}
	p, err := hybridFabric().NewProcess(ip)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	e, err := newEndpoint(context.Background(), p, Config{Addr: netip.AddrPortFrom(ip, port).String(), DomainDir: dir,
		Heartbeat: 50 * time.Millisecond, IdleTimeout: 2 * time.Second, HandshakeTimeout: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.Close() })
	return e, p
}

// TestHybridDialEcho: logical connections between two endpoints on one node
// over the real CM: one uplink each way however many connections, echo on
// every one, then a graceful close.
func TestHybridDialEcho(t *testing.T) {
	checkGoroutines(t)
	dir := t.TempDir() + "/goxrc"
	srv, _ := hybridEndpoint(t, 20311, dir)
	cli, _ := hybridEndpoint(t, 20312, dir)
	ctx := ctxT(t, 60*time.Second)

	const n = 20
	go func() {
		for {
			c, err := srv.Accept(ctx)
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				buf := make([]byte, 4096)
				for {
					k, err := c.Recv(ctx, buf)
					if err != nil {
						return
					}
					if err := c.Send(ctx, buf[:k]); err != nil {
						return
					}
				}
			}()
		}
	}()
	start := time.Now()
	conns := make([]*Conn, n)
	for i := range conns {
		c, err := cli.Dial(ctx, srv.Addr().String())
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		conns[i] = c
	}
	t.Logf("%d dials over the real CM in %v", n, time.Since(start))
	buf := make([]byte, 4096)
	for i, c := range conns {
		msg := fmt.Sprintf("hello %d", i)
		if err := c.Send(ctx, []byte(msg)); err != nil {
			t.Fatal(err)
		}
		k, err := c.Recv(ctx, buf)
		if err != nil || string(buf[:k]) != msg {
			t.Fatalf("conn %d: %q, %v", i, buf[:k], err)
		}
	}
	cs, ss := cli.Stats(), srv.Stats()
	t.Logf("client %+v", cs)
	t.Logf("server %+v", ss)
	if cs.Uplinks != 1 || ss.Uplinks != 1 {
		t.Errorf("uplinks: client %d, server %d; want one each way for %d connections", cs.Uplinks, ss.Uplinks, n)
	}
	if cs.Rejected != 0 || ss.Rejected != 0 || cs.Recoveries != 0 || ss.Recoveries != 0 {
		t.Errorf("rejects/recoveries: client %d/%d, server %d/%d", cs.Rejected, cs.Recoveries, ss.Rejected, ss.Recoveries)
	}
	for _, c := range conns {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	}
}
