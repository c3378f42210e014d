package cm

import (
	"context"
	"testing"
)

// Benchmarks of the framing and credit engine over the in-memory fake
// transport: what Conn itself costs per message, without RDMA. The
// integration benchmarks (test/integration, BenchmarkCM*) measure real rxe.

func BenchmarkConnPingPongFake(b *testing.B) {
	client, server, _ := fakePair(b, fakeOpts{msgSize: [2]int{4096, 4096}})
	ctx := context.Background()
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := server.Recv(ctx, buf)
			if err != nil || server.Send(ctx, buf[:n]) != nil {
				return
			}
		}
	}()
	msg, buf := make([]byte, 64), make([]byte, 64)
	b.ReportAllocs()
	for b.Loop() {
		if err := client.Send(ctx, msg); err != nil {
			b.Fatal(err)
		}
		if _, err := client.Recv(ctx, buf); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkConnRoundTripFake is a round trip driven from one goroutine
// (client Send, server Recv and Send, client Recv): every completion is
// there when polled, so nothing sleeps or hands off, and what remains is
// the Conn's own code on the data path, as a busy-polling caller pays it.
func BenchmarkConnRoundTripFake(b *testing.B) {
	client, server, _ := fakePair(b, fakeOpts{msgSize: [2]int{4096, 4096}})
	ctx := context.Background()
	msg, buf := make([]byte, 64), make([]byte, 4096)
	b.ReportAllocs()
	for b.Loop() {
		if err := client.Send(ctx, msg); err != nil {
			b.Fatal(err)
		}
		n, err := server.Recv(ctx, buf)
		if err != nil {
			b.Fatal(err)
		}
		if err := server.Send(ctx, buf[:n]); err != nil {
			b.Fatal(err)
		}
		if _, err := client.Recv(ctx, buf); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkConnStreamFake4K(b *testing.B) {
	client, server, _ := fakePair(b, fakeOpts{depth: [2]int{64, 64}, msgSize: [2]int{4096, 4096}})
	ctx := context.Background()
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 4096)
		for {
			n, err := server.Recv(ctx, buf)
			if err != nil || n == 1 {
				return
			}
		}
	}()
	msg := make([]byte, 4096)
	b.SetBytes(int64(len(msg)))
	b.ReportAllocs()
	for b.Loop() {
		if err := client.Send(ctx, msg); err != nil {
			b.Fatal(err)
		}
	}
	if err := client.Send(ctx, []byte{0}); err != nil {
		b.Fatal(err)
	}
	<-done
}
