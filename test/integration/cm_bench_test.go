//go:build linux && cgo

package integration

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/goxrc/goxrc/cm"
	"github.com/goxrc/goxrc/test/softroce"
)

// benchPair is cmPair for benchmarks.
func benchPair(tb testing.TB, opts ...cm.Option) (client, server *cm.Conn) {
	tb.Helper()
	_, ip := softroce.Device(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l, err := cm.Listen(ctx, netip.AddrPortFrom(ip, 0).String(), opts...)
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	accepted := acceptOne(tb, ctx, l)
	client, err = cm.Dial(ctx, l.Addr().String(), opts...)
	if err != nil {
		tb.Fatal(err)
	}
	server = <-accepted
	if server == nil {
		client.Close()
		tb.FailNow()
	}
	tb.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// BenchmarkCMPingPong64 is one 64-byte Send and the echo's Recv: a round
// trip (ns/op is the RTT; half of it is the one-way latency).
func BenchmarkCMPingPong64(b *testing.B) {
	client, server := benchPair(b, cm.WithMessageSize(4096))
	ctx := context.Background()
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := server.Recv(ctx, buf)
			if err != nil {
				return
			}
			if server.Send(ctx, buf[:n]) != nil {
				return
			}
		}
	}()
	msg, buf := make([]byte, 64), make([]byte, 64)
	for range 100 { // warm up
		client.Send(ctx, msg)
		client.Recv(ctx, buf)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := client.Send(ctx, msg); err != nil {
			b.Fatal(err)
		}
		if _, err := client.Recv(ctx, buf); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCMSend4K(b *testing.B)  { benchStream(b, 4096) }
func BenchmarkCMSend64K(b *testing.B) { benchStream(b, 64<<10) }

// benchStream streams size-byte messages to a receiver that drops them; a
// 1-byte message ends the run and is answered once all have arrived.
func benchStream(b *testing.B, size int) {
	client, server := benchPair(b, cm.WithMessageSize(size))
	ctx := context.Background()
	go func() {
		buf := make([]byte, size)
		for {
			n, err := server.Recv(ctx, buf)
			if err != nil {
				return
			}
			if n == 1 && server.Send(ctx, buf[:1]) != nil {
				return
			}
		}
	}()
	msg, end := make([]byte, size), []byte{0}
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if err := client.Send(ctx, msg); err != nil {
			b.Fatal(err)
		}
	}
	if err := client.Send(ctx, end); err != nil {
		b.Fatal(err)
	}
	if _, err := client.Recv(ctx, end); err != nil {
		b.Fatal(err)
	}
}

// TestCMSendRecvZeroAllocs: a message's Send and Recv allocate nothing on
// real RDMA. "polling": everything runs in this goroutine, one step after
// another, so each Recv finds its message while it polls. "sleeping": an
// echo goroutine answers, so both sides' Recv usually find nothing and sleep
// in the netpoller (the counts include the echo goroutine's calls).
// "one-sided": a WriteRemote into the peer's exposed region.
func TestCMSendRecvZeroAllocs(t *testing.T) {
	t.Run("one-sided", func(t *testing.T) {
		client, server := benchPair(t)
		ctx := context.Background()
		exposed, err := server.RegisterMemory(4096, cm.RemoteWrite)
		if err != nil {
			t.Fatal(err)
		}
		defer exposed.Close()
		local, err := client.RegisterMemory(4096, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer local.Close()
		desc := exposed.Descriptor()
		write := func() {
			if err := client.WriteRemote(ctx, local, 0, 64, desc, 100); err != nil {
				t.Fatal(err)
			}
		}
		allocs := allocsPer(200, write)
		t.Logf("%.3f allocations per WriteRemote", allocs)
		if allocs >= noAllocs {
			t.Errorf("%.3f allocations per WriteRemote, want none (under %g)", allocs, noAllocs)
		}
	})
	for _, size := range []int{64, 4096} {
		t.Run(fmt.Sprintf("polling/%d", size), func(t *testing.T) {
			client, server := benchPair(t, cm.WithMessageSize(size), cm.WithQueueDepth(16))
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			msg, buf := make([]byte, size), make([]byte, size)
			roundTrip := func() {
				if err := client.Send(ctx, msg); err != nil {
					t.Fatal(err)
				}
				if _, err := server.Recv(ctx, buf); err != nil {
					t.Fatal(err)
				}
				if err := server.Send(ctx, buf); err != nil {
					t.Fatal(err)
				}
				if _, err := client.Recv(ctx, buf); err != nil {
					t.Fatal(err)
				}
			}
			for range 50 {
				roundTrip()
			}
			allocs := allocsPer(500, roundTrip)
			t.Logf("%.3f allocations per round trip (2 Sends, 2 Recvs)", allocs)
			if allocs >= noAllocs {
				t.Errorf("%.3f allocations per round trip, want none (under %g)", allocs, noAllocs)
			}
		})
		// Sleeping must not allocate, with a context that cannot end and
		// with one that has a deadline (0.000 per round trip measured in
		// both, counted exactly).
		for _, deadline := range []bool{false, true} {
			name := fmt.Sprintf("sleeping/%d", size)
			if deadline {
				name = fmt.Sprintf("sleeping-with-deadline/%d", size)
			}
			t.Run(name, func(t *testing.T) {
				client, server := benchPair(t, cm.WithMessageSize(size), cm.WithQueueDepth(16))
				ctx := context.Background()
				if deadline {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, time.Minute)
					defer cancel()
				}
				go func() {
					buf := make([]byte, size)
					for {
						n, err := server.Recv(ctx, buf)
						if err != nil || server.Send(ctx, buf[:n]) != nil {
							return
						}
					}
				}()
				msg, buf := make([]byte, size), make([]byte, size)
				roundTrip := func() {
					if err := client.Send(ctx, msg); err != nil {
						t.Fatal(err)
					}
					if _, err := client.Recv(ctx, buf); err != nil {
						t.Fatal(err)
					}
				}
				for range 50 {
					roundTrip()
				}
				allocs := allocsPer(500, roundTrip)
				t.Logf("%.3f allocations per round trip (2 Sends, 2 Recvs, on two goroutines)", allocs)
				if allocs >= noAllocs {
					t.Errorf("%.3f allocations per round trip, want none (under %g): a Recv that sleeps in the netpoller allocates", allocs, noAllocs)
				}
			})
		}
	}
}

// noAllocs is the most allocations per round trip that still means "none":
// allocsPer counts the whole process, whose other goroutines (the device's
// completion pump, timers) allocate now and then; a message that allocated
// would count 1 or more.
const noAllocs = 0.05

// allocsPer is the mean number of heap allocations per call of f over runs
// calls, unrounded (testing.AllocsPerRun truncates to an integer, so up to
// runs-1 allocations read as 0), with GOMAXPROCS 1 as AllocsPerRun has it.
func allocsPer(runs int, f func()) float64 {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	f()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range runs {
		f()
	}
	runtime.ReadMemStats(&after)
	return float64(after.Mallocs-before.Mallocs) / float64(runs)
}

// setupSizes are the set-up benchmarks' connection sizes: the library's
// defaults (DefaultMessageSize x DefaultQueueDepth buffers each way) and
// the smallest, 64-byte messages at depth 2.
var setupSizes = []struct {
	name string
	opts []cm.Option
}{
	{"default", nil},
	{"small", []cm.Option{cm.WithMessageSize(64), cm.WithQueueDepth(2)}},
}

// BenchmarkCMDialChurn is a connection's set-up where connections come and
// go: each op is a Dial with its Accept, then both ends closed and released
// (Close waits out the CM's time-wait, about 2 s of ns/op), so the next Dial
// finds the last one's resources freed. us-setup/op is the Dial and Accept
// alone, timed with clock reads around them rather than the benchmark
// timer, whose StopTimer reads the memory statistics (a stop of the world)
// right before each. One connection made and closed first is not counted
// (us-first-setup: it opens the device and registers the first buffers).
// Both ends use each of setupSizes.
func BenchmarkCMDialChurn(b *testing.B) {
	for _, bc := range setupSizes {
		b.Run(bc.name, func(b *testing.B) {
			_, ip := softroce.Device(b)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			l, err := cm.Listen(ctx, netip.AddrPortFrom(ip, 0).String(), bc.opts...)
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			// connect returns the time a Dial and its Accept took.
			connect := func() time.Duration {
				start := time.Now()
				accepted := acceptOne(b, ctx, l)
				client, err := cm.Dial(ctx, l.Addr().String(), bc.opts...)
				if err != nil {
					b.Fatal(err)
				}
				server := <-accepted
				took := time.Since(start)
				if server == nil {
					client.Close()
					b.FailNow()
				}
				done := make(chan error, 1)
				go func() { done <- server.Close() }()
				if err := errors.Join(client.Close(), <-done); err != nil {
					b.Fatal(err)
				}
				return took
			}
			first := connect() // the device opened, the first buffers registered
			var setup time.Duration
			for b.Loop() {
				setup += connect()
			}
			b.ReportMetric(float64(first.Microseconds()), "us-first-setup")
			b.ReportMetric(float64(setup.Microseconds())/float64(b.N), "us-setup/op")
		})
	}
}

// BenchmarkCMDialOnly times a Dial of each of setupSizes from a process that
// only dials, one connection at a time, to a listener in another process
// (at the default sizes): each op dials, checks one message's echo and
// closes (the CM's time-wait, about 2 s, is most of ns/op; us-dial/op is
// the Dial alone, and the first Dial, us-first-dial, is not in it). Between
// connections the process holds nothing but the device cm keeps open while
// idle.
func BenchmarkCMDialOnly(b *testing.B) {
	for _, bc := range setupSizes {
		b.Run(bc.name, func(b *testing.B) {
			_, ip := softroce.Device(b)
			_, addr := startVictim(b, "acceptor", netip.AddrPortFrom(ip, 0).String())
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			msg := []byte("echo")
			buf := make([]byte, cm.DefaultMessageSize)
			dial := func() time.Duration {
				start := time.Now()
				c, err := cm.Dial(ctx, addr, bc.opts...)
				took := time.Since(start)
				if err != nil {
					b.Fatal(err)
				}
				if err = c.Send(ctx, msg); err == nil {
					var n int
					if n, err = c.Recv(ctx, buf); err == nil && string(buf[:n]) != string(msg) {
						err = fmt.Errorf("echo %q", buf[:n])
					}
				}
				if err = errors.Join(err, c.Close()); err != nil {
					b.Fatal(err)
				}
				return took
			}
			first := dial()
			var took time.Duration
			for b.Loop() {
				took += dial()
			}
			b.ReportMetric(float64(first.Microseconds()), "us-first-dial")
			b.ReportMetric(float64(took.Microseconds())/float64(b.N), "us-dial/op")
		})
	}
}
