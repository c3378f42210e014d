package cm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime/pprof"
	"testing"
	"time"
)

// TestConnEchoFloodNoDeadlock is the traffic of the integration test
// TestCMServerKilled without the kill: a client sends as fast as it can on
// one goroutine and reads the echoes on another, while the server echoes
// each message from a single goroutine (Recv, then Send). The server's Send
// waits for credits while it holds the client's messages unread, so credits
// flow only if each side returns them when the other is starved.
//
// Before progress took the caller's view of the rounds, depths 2 to 16
// stalled here within seconds (a sender that found no credit slept behind a
// receiver's round waiting for the echo of the message it held back), as
// TestCMServerKilled did once in the VM. Depth 1 (which the fake pair
// allows, bypassing the configuration) livelocked while credit frames
// answered each other: a data frame needs both of the peer's two receive
// buffers, and the two sides passed one credit back and forth for ever.
// It runs now, but about 80 times slower than depth 2 (9.7 s against
// 0.12 s for this test): its flow waits on the persist timer. That is why
// minQueueDepth is 2, for our configuration and for a peer's handshake
// (TestQueueDepthBelowTwoRefused).
func TestConnEchoFloodNoDeadlock(t *testing.T) {
	for _, depth := range []int{minQueueDepth, 4, 16} {
		t.Run(fmt.Sprint("depth", depth), func(t *testing.T) {
			client, server, _ := fakePair(t, fakeOpts{depth: [2]int{depth, depth}, msgSize: [2]int{4096, 4096}})
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			const count = 20000
			errs := make(chan error, 3)
			go func() { errs <- echoN(ctx, server, count, 4096) }()
			go func() { // the client's sender
				msg := make([]byte, 2048)
				for i := 0; i < count; i++ {
					msg[0], msg[1] = byte(i), byte(i>>8)
					if err := client.Send(ctx, msg); err != nil {
						errs <- fmt.Errorf("client send %d: %w (%+v)", i, err, client.Stats())
						return
					}
				}
				errs <- nil
			}()
			go func() { // the client's receiver
				buf := make([]byte, 4096)
				want := make([]byte, 2048)
				for i := 0; i < count; i++ {
					n, err := client.Recv(ctx, buf)
					if err != nil {
						errs <- fmt.Errorf("client recv %d: %w (%+v)", i, err, client.Stats())
						return
					}
					want[0], want[1] = byte(i), byte(i>>8)
					if !bytes.Equal(buf[:n], want) {
						errs <- fmt.Errorf("echo %d out of order or corrupt", i)
						return
					}
				}
				errs <- nil
			}()
			stalled := make(chan string, 1)
			go func() { // a stall is reported as it is, before the deadline unwinds it
				last, same := uint64(0), 0
				for ctx.Err() == nil {
					time.Sleep(500 * time.Millisecond)
					if n := client.Stats().MessagesReceived + server.Stats().MessagesReceived; n != last {
						last, same = n, 0
						continue
					}
					if same++; same == 10 {
						var b bytes.Buffer
						pprof.Lookup("goroutine").WriteTo(&b, 1)
						stalled <- fmt.Sprintf("stalled for 5 s:\nclient: %s\nserver: %s\n%s", connState(client), connState(server), b.String())
						cancel()
						return
					}
				}
			}()
			for range 3 {
				if err := <-errs; err != nil {
					select {
					case st := <-stalled:
						t.Fatalf("%v\n%s", err, st)
					default:
					}
					t.Fatalf("%v\nclient: %s\nserver: %s", err, connState(client), connState(server))
				}
			}
		})
	}
}

// connState describes a Conn's flow-control state, for failures.
func connState(c *Conn) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprintf("credits %d pending %d deferred %d peerStarved %v creditsDue %v freeSend %d inFlight %d unsignaled %d ready %d polling %v waiters %d sigEvery %d recvBatch %d recvSlots %d peerSlots %d",
		c.credits, c.pending, len(c.deferred), c.peerStarved, c.creditsDue.Load(), len(c.freeSend), c.inFlight.Len(), c.unsignaled, c.ready.Len(), c.polling, c.waiting.len(), c.sigEvery, c.recvBatch, c.recvSlots, c.peerSlots)
}

// TestQueueDepthBelowTwoRefused: neither our options nor a peer's handshake
// can set up a connection at depth 1 (see TestConnEchoFloodNoDeadlock).
func TestQueueDepthBelowTwoRefused(t *testing.T) {
	_, err := newConfig([]Option{WithQueueDepth(1)})
	if err == nil {
		t.Fatal("WithQueueDepth(1) accepted")
	}
	if _, err := newConfig([]Option{WithQueueDepth(2)}); err != nil {
		t.Fatalf("WithQueueDepth(2): %v", err)
	}
	if _, err := parseHello(hello{queueDepth: 1, maxMessage: 4096}.marshal()); !errors.Is(err, ErrProtocol) {
		t.Fatalf("a peer's depth 1: %v, want ErrProtocol", err)
	}
	if _, err := parseHello(hello{queueDepth: 2, maxMessage: 4096}.marshal()); err != nil {
		t.Fatalf("a peer's depth 2: %v", err)
	}
}
