//go:build linux && cgo

package xrc

import (
	"context"
	"net/netip"
	"testing"
	"time"
)

// Hooks for bench_hybrid_linux_test.go. Those benchmarks compare the engine
// with package cm's RC connections, and cm imports xrc, so they live in the
// external test package xrc_test, which reaches the unexported hybrid seam
// only through these.

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
