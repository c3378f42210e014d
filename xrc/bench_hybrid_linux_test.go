//go:build linux && cgo

package xrc_test

import (
	"context"
	"net/netip"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/goxrc/goxrc/cm"
	"github.com/goxrc/goxrc/xrc"
)

// What XRC buys at connection time, on soft-RoCE in the VM of
// test/vm/rxe-vm.sh (RXE_DEV, RXE_IP; both benchmarks skip elsewhere):
//
//   - BenchmarkHybridAddLogicalConn: one more logical connection between two
//     endpoints whose uplinks are already up. Its two legs take one SIDR
//     exchange through the real kernel CM (the dialer's VIRT_REQ; the
//     acceptor's ACCEPT carries the reverse leg) on the hybrid seam; no QP is
//     created, which the benchmark checks (model QP count, Stats.Uplinks).
//   - BenchmarkRCDial: a full RC connection through package cm (cm.Dial plus
//     the listener's Accept: CM id, resolve, QP, CQ, receive buffers,
//     connected exchange, goxrc's hello).
//
// Both keep one warm-up connection open throughout (the uplinks; cm's device
// context and PD) and time only the setup, with clock reads around it
// (xrc.BenchClock). Each setup follows the last one's at once, or after
// -xrc.bench-idle off the clock: compare the two at the same idle time.
// Run them with a fixed -test.benchtime Nx, alternately (test/bench-xrc.sh).
// Ports 20321-20329.

func rxeAddr(b *testing.B) netip.Addr {
	b.Helper()
	if os.Getenv("RXE_DEV") == "" {
		b.Skip("RXE_DEV unset: run through test/vm/rxe-vm.sh (test/bench-xrc.sh)")
	}
	ip, err := netip.ParseAddr(os.Getenv("RXE_IP"))
	if err != nil {
		b.Fatalf("RXE_IP: %v", err)
	}
	return ip
}

// BenchmarkHybridAddLogicalConn: after a warm-up Dial that brings up one
// uplink each way (the physical XRC-typed exchanges), each iteration Dials
// one more logical connection to the same endpoint (timed: Dial returns once
// both legs are up, i.e. after the one SIDR exchange whose ACCEPT carries
// the reverse leg), then closes it and waits
// until both ends have released it (not timed).
func BenchmarkHybridAddLogicalConn(b *testing.B) {
	ip := rxeAddr(b)
	dir := b.TempDir() + "/goxrc"
	srv := xrc.BenchHybridEndpoint(b, ip, 20321, dir)
	cli := xrc.BenchHybridEndpoint(b, ip, 20322, dir)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go xrc.BenchServe(ctx, srv)
	dctx := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 10*time.Second) }
	raddr := srv.Addr().String()

	wctx, wcancel := dctx()
	warm, err := cli.Dial(wctx, raddr)
	wcancel()
	if err != nil {
		b.Fatalf("warm-up dial: %v", err)
	}
	defer warm.Close()
	xrc.BenchWaitConns(b, 1, cli, srv)
	// One uplink each way between the two endpoints of this node: 2 INIs,
	// 2 TGTs (after the previous run's endpoints are gone).
	const ini0, tgt0 = 2, 2
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		ini, tgt := xrc.BenchHybridNodeQPs(ip)
		if ini == ini0 && tgt == tgt0 {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("after warm-up the node has %d INI + %d TGT QPs, want %d + %d", ini, tgt, ini0, tgt0)
		}
	}
	check := func(when string) {
		cs, ss := cli.Stats(), srv.Stats()
		ini, tgt := xrc.BenchHybridNodeQPs(ip)
		// The acceptor's reverse uplink comes up a moment after the
		// dialer's Dial returns: give the counts a little time.
		for deadline := time.Now().Add(5 * time.Second); (cs.Uplinks != 1 || ss.Uplinks != 1) && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
			cs, ss = cli.Stats(), srv.Stats()
			ini, tgt = xrc.BenchHybridNodeQPs(ip)
		}
		if cs.Uplinks != 1 || ss.Uplinks != 1 || ini != ini0 || tgt != tgt0 {
			b.Fatalf("%s: uplinks client %d server %d, node QPs %d INI + %d TGT (after warm-up %d + %d): not the SIDR-only path",
				when, cs.Uplinks, ss.Uplinks, ini, tgt, ini0, tgt0)
		}
		if cs.Rejected != 0 || ss.Rejected != 0 || cs.Recoveries != 0 || ss.Recoveries != 0 {
			b.Fatalf("%s: rejects/recoveries client %d/%d, server %d/%d", when, cs.Rejected, cs.Recoveries, ss.Rejected, ss.Recoveries)
		}
	}
	check("after warm-up")
	sidr0 := cli.Stats().VirtReqs + srv.Stats().VirtReqs

	var release time.Duration // Close until both ends have let go (untimed)
	var clock xrc.BenchClock
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var c *xrc.Conn
		clock.Idle()
		clock.Time(func() {
			ictx, icancel := dctx()
			defer icancel()
			c, err = cli.Dial(ictx, raddr)
		})
		if err != nil {
			b.Fatalf("dial %d: %v", i, err)
		}
		if i == 0 {
			if cs := cli.Stats(); cs.Conns != 2 {
				b.Fatalf("client holds %d connections with the new one, want 2", cs.Conns)
			}
			check("with the new connection")
		}
		t0 := time.Now()
		c.Close()
		xrc.BenchWaitConns(b, 1, cli, srv)
		release += time.Since(t0)
	}
	b.StopTimer()
	clock.Report(b)
	check("at the end")
	ini, tgt := xrc.BenchHybridNodeQPs(ip)
	b.ReportMetric(float64(cli.Stats().Uplinks), "uplinks")
	b.ReportMetric(float64(ini+tgt-ini0-tgt0), "newQPs")
	b.ReportMetric(float64(release.Microseconds())/float64(b.N), "us-untimed-close/op")
	// SIDR exchanges per logical connection: 1 when the reverse leg rides
	// the forward leg's ACCEPT, 2 on the reciprocal path.
	b.ReportMetric(float64(cli.Stats().VirtReqs+srv.Stats().VirtReqs-sidr0)/float64(b.N), "sidr/op")
}

// BenchmarkRCDial: each iteration is cm.Dial plus the listener's Accept of
// one RC connection (timed), with the smallest buffers cm takes here
// (64-byte messages, queue depth 2: the cheapest RC setup). Every
// connection stays open until the loop ends, and all are closed then, off
// the clock: a Close waits out the CM's time-wait (about 2 s on rxe), and
// no teardown runs beside a timed setup.
func BenchmarkRCDial(b *testing.B) {
	ip := rxeAddr(b)
	addr := netip.AddrPortFrom(ip, 20325).String()
	opts := []cm.Option{cm.WithMessageSize(64), cm.WithQueueDepth(2), cm.WithHandshakeTimeout(10 * time.Second)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l, err := cm.Listen(ctx, addr, opts...)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	accepted := make(chan *cm.Conn)
	go func() {
		for {
			c, err := l.Accept(ctx)
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	closeBoth := func(cs ...*cm.Conn) { // concurrently, as two peers would
		var wg sync.WaitGroup
		for _, c := range cs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c.Close()
			}()
		}
		wg.Wait()
	}
	dial := func() (*cm.Conn, *cm.Conn) {
		dctx, dcancel := context.WithTimeout(ctx, 20*time.Second)
		defer dcancel()
		c, err := cm.Dial(dctx, addr, opts...)
		if err != nil {
			b.Fatalf("dial: %v", err)
		}
		select {
		case s, ok := <-accepted:
			if !ok {
				b.Fatal("listener stopped")
			}
			return c, s
		case <-dctx.Done():
			b.Fatal("no accepted connection")
		}
		return nil, nil
	}
	wc, ws := dial() // warm-up: opens cm's device context and PD
	defer closeBoth(wc, ws)

	var clock xrc.BenchClock
	conns := make([]*cm.Conn, 0, 2*b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var c, s *cm.Conn
		clock.Idle()
		clock.Time(func() { c, s = dial() })
		conns = append(conns, c, s)
	}
	b.StopTimer()
	clock.Report(b)
	closeBoth(conns...)
}
