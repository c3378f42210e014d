//go:build linux && cgo

package xrc

import (
	"context"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/xrc/internal/wire"
)

// Benchmarks on the hybrid seam that need the package's internals, and hooks
// for bench_hybrid_linux_test.go: those compare the engine with package cm's
// RC connections, and cm imports xrc, so they live in the external test
// package xrc_test, which reaches the unexported seam only through these.
// Ports 20321-20329 (with bench_hybrid_linux_test.go).

// BenchHybridEndpoint starts an endpoint on the hybrid seam (real kernel CM on
// the soft-RoCE device at ip, the model's QPs) listening on ip:port, with the
// node's domain in dir. It is closed when tb ends.
func BenchHybridEndpoint(tb testing.TB, ip netip.Addr, port uint16, dir string) *Endpoint {
	tb.Helper()
	p, err := hybridFabric().NewProcess(ip)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { p.Close() })
	cfg := Config{Addr: netip.AddrPortFrom(ip, port).String(), DomainDir: dir,
		Heartbeat: 50 * time.Millisecond, IdleTimeout: 2 * time.Second, HandshakeTimeout: 10 * time.Second}
	e, err := newEndpoint(context.Background(), p, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { e.Close() })
	return e
}

// BenchHybridNodeQPs is the number of INI and TGT QPs that exist on the
// (model) node of the device at ip, over every process of this OS process.
func BenchHybridNodeQPs(ip netip.Addr) (ini, tgt int) {
	return hybridFabric().Node(ip).QPCount()
}

// BenchmarkHybridSIDRExchange is the floor under a logical connection's
// setup: one bare SIDR exchange through the real kernel CM on the hybrid
// seam, without the engine (Connect: the spare id kcm began resolving to
// the destination as the previous exchange started, SIDR REQ; the listener's
// CONNECT_REQUEST; Accept: SIDR REP; ESTABLISHED; both ids destroyed).
// Adding a logical connection over live uplinks takes one of them (the
// reverse leg rides its ACCEPT; two before). It reports each step's mean as
// well, to show where an exchange's time goes (Connect and Accept are each
// one system call into the kernel CM, which sends a MAD). Skips without
// RXE_DEV.
func BenchmarkHybridSIDRExchange(b *testing.B) {
	if os.Getenv("RXE_DEV") == "" {
		b.Skip("RXE_DEV unset: run through test/vm/rxe-vm.sh (test/bench-xrc.sh)")
	}
	ip, err := netip.ParseAddr(os.Getenv("RXE_IP"))
	if err != nil {
		b.Fatalf("RXE_IP: %v", err)
	}
	cli, err := hybridFabric().NewProcess(ip)
	if err != nil {
		b.Fatal(err)
	}
	defer cli.Close()
	srv, err := hybridFabric().NewProcess(ip)
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	dst := netip.AddrPortFrom(ip, 20327)
	l, err := srv.Listen(dst, kernel.ExchangeSIDR)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	req, rep := make([]byte, wire.BudgetSIDRREQ), make([]byte, wire.BudgetSIDRREP)
	const qpn = 0x6f5a5a // made up: SIDR carries it, nothing uses it
	// The steps, in order; each is timed from the end of the one before.
	steps := [...]string{"connect", "request", "accept", "reply", "destroy"}
	var spent [len(steps)]time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t := time.Now()
		lap := func(step int) {
			now := time.Now()
			spent[step] += now.Sub(t)
			t = now
		}
		id, err := cli.Connect(ctx, dst, kernel.ExchangeSIDR, 0, req)
		if err != nil {
			b.Fatalf("connect %d: %v", i, err)
		}
		lap(0)
		cr, err := srv.Event(ctx, l)
		if err != nil || cr.Type != kernel.EventConnectRequest {
			b.Fatalf("listener %d: %v %v", i, cr.Type, err)
		}
		lap(1)
		if err := srv.Accept(cr.ID, qpn, rep); err != nil {
			b.Fatalf("accept %d: %v", i, err)
		}
		lap(2)
		ev, err := cli.Event(ctx, id)
		if err != nil || ev.Type != kernel.EventEstablished || ev.QPNum != qpn {
			b.Fatalf("dialer %d: %v %#x %v", i, ev.Type, ev.QPNum, err)
		}
		lap(3)
		srv.DestroyID(cr.ID)
		cli.DestroyID(id)
		lap(4)
	}
	b.StopTimer()
	for i, name := range steps {
		b.ReportMetric(float64(spent[i].Microseconds())/float64(b.N), "us-"+name+"/op")
	}
}
