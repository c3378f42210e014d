package cm

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The credit frames that three traffic patterns cost, against bounds a
// ping-pong of credit frames breaks by far. Credit frames consume the
// peer's receive buffers too; answering them at once made every credit
// frame call for another: at depth 2 a one-way stream cost three credit
// frames per message and an echo flood over thirty, and now and then the
// two sides traded one credit for ever while the data waited (the
// integration test TestCMFlowControlSlowReceiver timed out so on rxe).
func TestConnCreditFramesStayFew(t *testing.T) {
	const count = 2000
	for _, depth := range []int{2, 3, 8, 64} {
		// At depth 2 a receiver returns every message (half of three
		// buffers is one); from depth 8 at most a few per threshold.
		perMsg := 1.2
		if depth >= 8 {
			perMsg = 0.6
		}
		if depth >= 64 {
			perMsg = 0.1
		}
		t.Run(fmt.Sprint("one-way/depth", depth), func(t *testing.T) {
			a, b, _ := fakePair(t, fakeOpts{depth: [2]int{depth, depth}})
			ctx := ctxT(t)
			errc := make(chan error, 1)
			go func() { errc <- sendN(ctx, a, count) }()
			require.NoError(t, recvN(ctx, b, count))
			require.NoError(t, <-errc)
			frames := a.Stats().CreditFrames + b.Stats().CreditFrames
			t.Logf("%d credit frames for %d messages", frames, count)
			require.LessOrEqual(t, float64(frames), perMsg*count)
		})
		t.Run(fmt.Sprint("echo/depth", depth), func(t *testing.T) {
			client, server, _ := fakePair(t, fakeOpts{depth: [2]int{depth, depth}})
			ctx := ctxT(t)
			errs := make(chan error, 3)
			go func() { errs <- echoN(ctx, server, count, 256) }()
			go func() { errs <- sendN(ctx, client, count) }()
			go func() { errs <- recvN(ctx, client, count) }()
			for range 3 {
				require.NoError(t, <-errs)
			}
			frames := client.Stats().CreditFrames + server.Stats().CreditFrames
			t.Logf("%d credit frames for %d messages each way", frames, count)
			require.LessOrEqual(t, float64(frames), 2*perMsg*count)
		})
	}
}

// A receiver whose queue is deeper than its peer's returns credits by the
// peer's window, the smaller depth plus one (both sides agree on it in the
// handshake), not by its own buffers: a peer with a smaller window never
// fills half of them, so every return waited until the peer ran dry and
// said so, a round trip lost per window (found by a review: 40% of a
// stream's rate with 100 us of latency). Half the window sent and read
// must bring a credit frame back by itself.
func TestConnCreditsFollowTheSmallerWindow(t *testing.T) {
	for _, deep := range []int{0, 1} { // the side with the deeper queue
		t.Run(fmt.Sprint("deeper side", deep), func(t *testing.T) {
			depth := [2]int{16, 16}
			depth[deep] = 64
			conns := [2]*Conn{}
			conns[0], conns[1], _ = fakePair(t, fakeOpts{depth: depth})
			receiver, sender := conns[deep], conns[1-deep]
			ctx := ctxT(t)
			half := (16 + 1) / 2 // messages: the sender's credits are 17, one kept back
			require.NoError(t, sendN(ctx, sender, half))
			require.NoError(t, recvN(ctx, receiver, half))
			deadline := time.Now().Add(5 * time.Second)
			for receiver.Stats().CreditFrames == 0 && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			require.Equal(t, uint64(1), receiver.Stats().CreditFrames,
				"credit frames after half the smaller window was read")
		})
	}
}

// Two peers that both send and neither reads are stuck, as two TCP
// senders with full windows are; they must not spin trading credit frames
// while they wait (they did, 600000 frames a second).
func TestConnStuckSendersDoNotSpin(t *testing.T) {
	for _, depth := range []int{2, 3, 8} {
		t.Run(fmt.Sprint("depth", depth), func(t *testing.T) {
			a, b, _ := fakePair(t, fakeOpts{depth: [2]int{depth, depth}})
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			for _, c := range []*Conn{a, b} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for c.Send(ctx, []byte("x")) == nil {
					}
				}()
			}
			// a reads a few, which makes it return credits, then stops.
			buf := make([]byte, 256)
			for range depth / 2 {
				_, err := a.Recv(ctx, buf)
				require.NoError(t, err)
			}
			// Both stuck: each filled the other's buffers, and b used
			// the credits a's reads returned (the last may come by the
			// persist timer; a 10 s wait for it failed once in CI, the
			// buffer of a's last read never going back: see
			// TestConnReadAfterOwnDataReachesShortPeer).
			want := [2]uint64{uint64(depth), uint64(depth + depth/2)}
			var got [2]uint64
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
				got = [2]uint64{a.Stats().MessagesSent, b.Stats().MessagesSent}
				if got == want || time.Now().After(deadline) {
					break
				}
			}
			// The counts it ended at, and the credit frames: it failed
			// once in a CI run under load, with only "never both stuck".
			require.Equal(t, want, got, "messages sent by a and b; a %+v, b %+v", a.Stats(), b.Stats())
			time.Sleep(50 * time.Millisecond)
			before := a.Stats().CreditFrames + b.Stats().CreditFrames
			time.Sleep(200 * time.Millisecond)
			spun := a.Stats().CreditFrames + b.Stats().CreditFrames - before
			cancel()
			wg.Wait()
			t.Logf("%d credit frames while stuck for 200 ms", spun)
			// The persist timer's doubling allows about a dozen.
			require.LessOrEqual(t, spun, uint64(30))
			// And no more: b got back exactly the buffers a read.
			require.Equal(t, want[0], a.Stats().MessagesSent)
			require.Equal(t, want[1], b.Stats().MessagesSent)
		})
	}
}

// A message read after our own data frame went out, when the peer's last
// frame said it was short, must still go back. Below the repost batch its
// buffer waited unposted, where neither a credit frame nor the persist
// timer looks, for the peer's next frame, which a short peer that reads
// nothing never sends (depth 8, batch 2: TestConnStuckSendersDoNotSpin
// failed so in CI, b stuck with one credit and a's read unreturned).
// The steps run one at a time, all on this goroutine but a's Send that
// only the credits in b's short frame let through.
func TestConnReadAfterOwnDataReachesShortPeer(t *testing.T) {
	a, b, _ := fakePair(t, fakeOpts{depth: [2]int{8, 8}}) // 9 credits, one kept back
	ctx := ctxT(t)
	require.NoError(t, sendN(ctx, b, 7)) // b: 2 credits left, not short
	require.NoError(t, sendN(ctx, a, 6)) // a: 3 left
	require.NoError(t, recvN(ctx, b, 2)) // b reposts both: 2 to return, none due
	require.NoError(t, sendN(ctx, a, 2)) // a: 1 left, short
	sent := make(chan error, 1)
	go func() { sent <- a.Send(ctx, []byte("a9")) }() // waits for credits
	// b's 8th message leaves it short and returns the 2 it read: a takes
	// it, then sends its 9th, which returns nothing.
	require.NoError(t, b.Send(ctx, []byte("b8")))
	require.NoError(t, <-sent)
	// a reads one of b's messages: its buffer is b's, and b has one
	// credit, the one it keeps back.
	buf := make([]byte, 256)
	_, err := a.Recv(ctx, buf)
	require.NoError(t, err)
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second) // a hang guard, not a bound
	defer cancel()
	require.NoError(t, b.Send(sctx, []byte("b9")), "b never got back the buffer a read: a %+v, b %+v", a.Stats(), b.Stats())
}

// echoN is an echo server on one goroutine: Recv, then Send, n times.
func echoN(ctx context.Context, c *Conn, n, bufSize int) error {
	buf := make([]byte, bufSize)
	for i := 0; i < n; i++ {
		k, err := c.Recv(ctx, buf)
		if err == nil {
			err = c.Send(ctx, buf[:k])
		}
		if err != nil {
			return fmt.Errorf("echo, message %d: %w (%+v)", i, err, c.Stats())
		}
	}
	return nil
}

// sendN sends "message 0" to "message n-1"; pause, if set, runs before
// each.
func sendN(ctx context.Context, c *Conn, n int, pause ...func()) error {
	for i := 0; i < n; i++ {
		for _, p := range pause {
			p()
		}
		if err := c.Send(ctx, []byte(fmt.Sprintf("message %d", i))); err != nil {
			return fmt.Errorf("send %d: %w", i, err)
		}
	}
	return nil
}

// recvN receives what sendN sends and checks it; pause, if set, runs
// before each.
func recvN(ctx context.Context, c *Conn, n int, pause ...func()) error {
	buf := make([]byte, 256)
	for i := 0; i < n; i++ {
		for _, p := range pause {
			p()
		}
		k, err := c.Recv(ctx, buf)
		if err != nil {
			return fmt.Errorf("recv %d: %w", i, err)
		}
		if want := fmt.Sprintf("message %d", i); string(buf[:k]) != want {
			return fmt.Errorf("recv %d: %q, want %q", i, buf[:k], want)
		}
	}
	return nil
}

// Both sides send and receive at once with small, unequal queues, each
// reader and sender pausing at random: every message must arrive, in
// order, and traffic must never stall. Credits then go back by every
// route there is: on messages, in credit frames, and by the persist
// timer when a side is short and nothing else carries them.
func TestConnFlowControlLivenessRandomized(t *testing.T) {
	for seed := uint64(1); seed <= 12; seed++ {
		r := rand.New(rand.NewPCG(seed, 7))
		depth := [2]int{2 + r.IntN(5), 2 + r.IntN(5)}
		t.Run(fmt.Sprintf("seed%d/depth%d-%d", seed, depth[0], depth[1]), func(t *testing.T) {
			a, b, _ := fakePair(t, fakeOpts{depth: depth})
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			const count = 1500
			errs := make(chan error, 4)
			// A pause of up to 300 us before one call in 50.
			pause := func(stream uint64) func() {
				r := rand.New(rand.NewPCG(seed, stream))
				return func() {
					if r.IntN(50) == 0 {
						time.Sleep(time.Duration(r.IntN(300)) * time.Microsecond)
					}
				}
			}
			for i, c := range []*Conn{a, b} {
				send, recv := pause(uint64(10+i)), pause(uint64(20+i))
				go func() { errs <- sendN(ctx, c, count, send) }()
				go func() { errs <- recvN(ctx, c, count, recv) }()
			}
			for range 4 {
				if err := <-errs; err != nil {
					cancel()
					t.Fatalf("%v\na: %s\nb: %s", err, connState(a), connState(b))
				}
			}
		})
	}
}
