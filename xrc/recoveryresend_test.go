package xrc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// A recovery that outlives its deadline (a slow receiver, as in
// TestRecoveryOneSlowReceiverFailsNoOther) resends a moved leg's flushed
// messages with that expired context: c.resend's takeTurn then gives up as
// soon as the turn is not free at that instant (another Send of the
// connection checking the uplink's state), and the flushed messages are
// never posted again. The receiver sees a gap: messages lost in silence.
func TestRecoveryResendAfterDeadline(t *testing.T) {
	w := newWorld(t)
	hs := func(c *Config) { longTimers(c); c.HandshakeTimeout = time.Second }
	s := w.endpoint("10.0.73.1", 7000, hs)
	countedTags(s.Endpoint)
	g := &stallMoves{release: make(chan struct{})}
	defer close(g.release)
	r1 := w.endpoint("10.0.73.2", 7001, longTimers)
	r2 := w.wrappedEndpoint("10.0.73.2", 7002, func(k kernel.Kernel) kernel.Kernel { g.Kernel = k; return g }, longTimers)
	r3 := w.endpoint("10.0.73.2", 7003, longTimers)
	s1, c1 := pair(t, s, r1) // moved first, by PHYS: fine
	pair(t, s, r2)           // its MOVE waits past the recovery's deadline
	s3, _ := pair(t, s, r3)  // killed: the send error that starts the recovery
	ctx := ctxT(t, 20*time.Second)

	// The stream on s1: numbered messages (8+ bytes); spam: 1-byte messages.
	const total = 3000
	var sent atomic.Int64
	streamErr := make(chan error, 1)
	go func() {
		for i := 0; i < total; i++ {
			if err := s1.Send(ctx, seqMsg(i)); err != nil {
				streamErr <- fmt.Errorf("send %d: %w", i, err)
				return
			}
			sent.Store(int64(i + 1))
		}
		streamErr <- nil
	}()
	recvErr := make(chan error, 1)
	go func() {
		buf := make([]byte, 64)
		next := 0
		for next < total {
			n, err := c1.Recv(ctx, buf)
			if err != nil {
				recvErr <- fmt.Errorf("recv %d: %w", next, err)
				return
			}
			if n == 1 {
				continue // spam
			}
			if err := checkSeqMsg(buf[:n], next); err != nil {
				recvErr <- fmt.Errorf("after %d in order: %w", next, err)
				return
			}
			next++
		}
		recvErr <- nil
	}()
	for sent.Load() < 200 {
		time.Sleep(time.Millisecond)
	}
	// Other goroutines of the application call Send on s1 with short
	// deadlines: each takes the turn a moment, finds the uplink recovering
	// and lets it go.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				sctx, cancel := context.WithTimeout(ctx, 200*time.Microsecond)
				s1.Send(sctx, []byte{'S'})
				cancel()
			}
		}()
	}
	r3.p.Kill()
	if err := sendErr(t, s3); !errors.Is(err, ErrPeerGone) {
		t.Fatalf("to the dead: %v", err)
	}
	time.Sleep(1500 * time.Millisecond) // past the recovery's deadline
	close(stop)
	wg.Wait()
	select {
	case err := <-recvErr:
		if err != nil {
			t.Fatalf("stream on the moved leg: %v (sender %+v, r1 %+v)", err, s.Stats(), r1.Stats())
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("stream on the moved leg stalled (sender %+v, r1 %+v)", s.Stats(), r1.Stats())
	}
	if err := <-streamErr; err != nil {
		t.Fatal(err)
	}
}
