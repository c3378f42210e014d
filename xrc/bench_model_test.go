package xrc

import (
	"context"
	"flag"
	"net/netip"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/internal/kernel/model"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// The engine's own cost, with no kernel and no emulator: on the in-memory
// model, natively on the host, the time to add a logical connection over a
// live uplink (BenchmarkModelAddLogicalConn, the model's twin of
// BenchmarkHybridAddLogicalConn) against the model's bare SIDR exchange
// (BenchmarkModelSIDRExchange, the twin of BenchmarkHybridSIDRExchange).
// Their difference is what the engine adds per logical connection: its Go
// code and the goroutines it wakes. Run:
//
//	go test -run '^$' -bench '^BenchmarkModel' -benchtime 20000x -count 3 ./xrc

// BenchClock times only part of each iteration of a benchmark loop (the
// setup, not the teardown), with clock reads around it, and reports the
// mean as ns/op. b.StopTimer and b.StartTimer would time the same, but
// each reads the memory statistics, which stops the world, right before
// the next timed setup: on the model that added about 20 us, a third, to
// a logical connection.
type BenchClock struct{ spent time.Duration }

// benchIdle is the idle time before each timed setup (BenchClock.Idle).
// Under emulation a setup that follows two idle seconds takes far longer
// than one right after the last, and not by the same factor for every
// kind of setup (docs/xrc-benchmarks.md), so setups compared against each
// other must follow the same idle time.
var benchIdle = flag.Duration("xrc.bench-idle", 0, "idle time, off the clock, before each timed setup of the connection benchmarks (0: back to back)")

// Idle waits, off the clock, for the -xrc.bench-idle time.
func (k *BenchClock) Idle() {
	if *benchIdle > 0 {
		time.Sleep(*benchIdle)
	}
}

// Time runs f on the clock.
func (k *BenchClock) Time(f func()) {
	t := time.Now()
	f()
	k.spent += time.Since(t)
}

// Report sets b's ns/op to the mean time on the clock.
func (k *BenchClock) Report(b *testing.B) {
	b.ReportMetric(float64(k.spent.Nanoseconds())/float64(b.N), "ns/op")
}

// BenchServe accepts e's connections until ctx ends, and reads each until
// the dialer's FIN, then closes it (for the benchmarks here and in
// bench_hybrid_linux_test.go).
func BenchServe(ctx context.Context, e *Endpoint) {
	for {
		c, err := e.Accept(ctx)
		if err != nil {
			return
		}
		go func() {
			buf := make([]byte, 64)
			for {
				if _, err := c.Recv(ctx, buf); err != nil {
					c.Close()
					return
				}
			}
		}()
	}
}

// BenchWaitConns waits until every endpoint of es holds exactly want
// connections (after a Close, both ends have let go).
func BenchWaitConns(b *testing.B, want int, es ...*Endpoint) {
	b.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok := true
		for _, e := range es {
			ok = ok && e.Stats().Conns == want
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			for _, e := range es {
				b.Logf("%v: %+v", e.Addr(), e.Stats())
			}
			b.Fatalf("connections never went back to %d", want)
		}
		time.Sleep(20 * time.Microsecond)
	}
}

// BenchmarkModelAddLogicalConn: after a warm-up Dial that brings up the
// uplinks, each iteration Dials one more logical connection to the same
// endpoint (timed until Dial returns, see BenchClock), then closes it and
// waits until both ends have released it (untimed). It fails if a dial
// makes a QP.
func BenchmarkModelAddLogicalConn(b *testing.B) {
	f := memfabric.New()
	node := f.Node("10.9.0.1")
	dir := b.TempDir() + "/goxrc"
	open := func(port string) *Endpoint {
		e, err := NewEndpoint(context.Background(), Config{Process: node.Process(), Addr: "10.9.0.1:" + port,
			DomainDir: dir, Heartbeat: 50 * time.Millisecond, IdleTimeout: 2 * time.Second, HandshakeTimeout: 10 * time.Second})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { e.Close() })
		return e
	}
	srv, cli := open("1"), open("2")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go BenchServe(ctx, srv)
	raddr := srv.Addr().String()
	warm, err := cli.Dial(ctx, raddr)
	if err != nil {
		b.Fatal(err)
	}
	defer warm.Close()
	BenchWaitConns(b, 1, cli, srv)
	qps := node.Stats().QPs()
	var clock BenchClock
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		var c *Conn
		clock.Idle()
		clock.Time(func() { c, err = cli.Dial(ctx, raddr) })
		if err != nil {
			b.Fatalf("dial %d: %v", i, err)
		}
		c.Close()
		BenchWaitConns(b, 1, cli, srv)
	}
	b.StopTimer()
	clock.Report(b)
	if n := node.Stats().QPs(); n != qps {
		b.Fatalf("the node has %d QPs after the dials, %d before: a logical connection made a QP", n, qps)
	}
}

// BenchmarkModelSIDRExchange: one bare SIDR exchange on the model (Connect,
// the listener's request, Accept, the reply, both ids destroyed), the
// acceptor in its own goroutine as the engine's listen loop is.
func BenchmarkModelSIDRExchange(b *testing.B) {
	node := model.NewFabric(model.ReuseNever).AddNode(netip.MustParseAddr("10.9.0.1"), model.NodeConfig{})
	cli, srv := node.NewProcess(), node.NewProcess()
	defer cli.Close()
	defer srv.Close()
	dst := netip.MustParseAddrPort("10.9.0.1:7")
	l, err := srv.Listen(dst, kernel.ExchangeSIDR)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	req, rep := make([]byte, 56), make([]byte, 136)
	go func() {
		for {
			cr, err := srv.Event(ctx, l)
			if err != nil {
				return
			}
			srv.Accept(cr.ID, 0x1234, rep)
			srv.DestroyID(cr.ID)
		}
	}()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id, err := cli.Connect(ctx, dst, kernel.ExchangeSIDR, 0, req)
		if err != nil {
			b.Fatal(err)
		}
		if ev, err := cli.Event(ctx, id); err != nil || ev.Type != kernel.EventEstablished {
			b.Fatalf("exchange %d: %v %v", i, ev.Type, err)
		}
		cli.DestroyID(id)
	}
}

// BenchmarkModelRoundTrip: a 64-byte ping-pong on one logical connection
// between two nodes of the model, an echo goroutine at the far end: the
// engine's data path (framing, flow control, completions, queues) with no
// kernel, as allocations and ns per round trip.
func BenchmarkModelRoundTrip(b *testing.B) {
	srv, cli := benchPair(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		c, err := srv.Accept(ctx)
		if err != nil {
			return
		}
		buf := make([]byte, 64)
		for {
			n, err := c.Recv(ctx, buf)
			if err != nil || c.Send(ctx, buf[:n]) != nil {
				return
			}
		}
	}()
	c, err := cli.Dial(ctx, srv.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	msg, buf := make([]byte, 64), make([]byte, 64)
	b.ReportAllocs()
	for b.Loop() {
		if err := c.Send(ctx, msg); err != nil {
			b.Fatal(err)
		}
		if _, err := c.Recv(ctx, buf); err != nil {
			b.Fatal(err)
		}
	}
}

// benchPair opens two endpoints on two nodes of a fresh in-memory fabric.
func benchPair(b *testing.B) (srv, cli *Endpoint) {
	f := memfabric.New()
	open := func(ip string) *Endpoint {
		e, err := NewEndpoint(context.Background(), Config{Process: f.Node(ip).Process(), Addr: ip + ":7000",
			DomainDir: b.TempDir() + "/goxrc", HandshakeTimeout: 10 * time.Second})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { e.Close() })
		return e
	}
	return open("10.9.0.1"), open("10.9.0.2")
}

// BenchmarkModelStream: one goroutine sends 64-byte messages on one logical
// connection as fast as Send returns, a goroutine at the far end takes
// them: what one sender moves, as ns and allocations per message.
func BenchmarkModelStream(b *testing.B) {
	srv, cli := benchPair(b)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	got := make(chan int, 1)
	go func() {
		c, err := srv.Accept(ctx)
		if err != nil {
			return
		}
		buf := make([]byte, 64)
		for n := 0; ; n++ {
			if _, err := c.Recv(ctx, buf); err != nil {
				got <- n
				return
			}
		}
	}()
	c, err := cli.Dial(ctx, srv.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	msg := make([]byte, 64)
	b.ReportAllocs()
	sent := 0
	for b.Loop() {
		if err := c.Send(ctx, msg); err != nil {
			b.Fatal(err)
		}
		sent++
	}
	c.Close() // FIN after the last message: the receiver's Recv ends with EOF
	if n := <-got; n != sent {
		b.Fatalf("received %d of %d messages", n, sent)
	}
}
