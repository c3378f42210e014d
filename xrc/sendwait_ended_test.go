package xrc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/goxrc/goxrc/xrc/memfabric"
)

// endingCtx is a context that ends together with a connection: the first
// time a Send evaluates its Done where at says the Send waits (a select's
// operands are evaluated on entry to it, before it chooses), end ends the
// connection and waits for its end; from then on Done is closed and Err
// is context.Canceled. The select then finds the connection's end and the
// context's ready together, as when a context ends at the moment its
// connection does.
type endingCtx struct {
	context.Context // Background: no deadline, no values
	at              func() bool
	end             func()
	mu              sync.Mutex
	ended           bool
}

var closedDone = func() chan struct{} { ch := make(chan struct{}); close(ch); return ch }()

func (x *endingCtx) Done() <-chan struct{} {
	x.mu.Lock()
	defer x.mu.Unlock()
	if !x.ended && x.at() {
		x.end()
		x.ended = true
	}
	if x.ended {
		return closedDone
	}
	return nil // not yet: never ready, as Background's
}

func (x *endingCtx) Err() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.ended {
		return context.Canceled
	}
	return nil
}

// deviceLost fails node's device and waits until c and its endpoint e have
// ended.
func deviceLost(t *testing.T, n *memfabric.Node, c *Conn, e *Endpoint) {
	n.FailDevice()
	for _, ch := range []<-chan struct{}{c.done, e.ctx.Done()} {
		select {
		case <-ch:
		case <-time.After(5 * time.Second):
			t.Error("the device's loss did not end the connection and the endpoint within 5s")
			return
		}
	}
}

// A Send whose context ends as its connection does, while it waits for a
// credit (sendData) or for room in a full send queue (postData), says why
// the connection ended (the device's loss: ErrDeviceRemoved, which cm maps
// to ErrPeerGone), as it does waiting for its turn (takeTurn, c70d67e) or
// with nothing to wait for; not context.Canceled (a deadline's
// DeadlineExceeded: a timeout to cm), which those two waits answered
// whenever select took the context's end over the connection's: once in
// three for credits (32 Sends here), once in five for room (64 Sends):
// each case passes about once in a million runs of the old code (12 of 32
// and 6 of 32 Sends failed in one run).
func TestSendWaitingEndedContextSaysWhyConnEnded(t *testing.T) {
	t.Run("credit", func(t *testing.T) {
		for i := range 32 {
			t.Run(fmt.Sprint(i), func(t *testing.T) {
				w := newWorld(t)
				s := w.endpoint("10.0.87.1", 7000, longTimers)
				r := w.endpoint("10.0.87.2", 7000, longTimers, func(c *Config) { c.RecvWindow = 1 })
				sc, _ := pair(t, s, r)
				// The window's one credit: r reads nothing, so the next
				// Send waits for a credit.
				if err := sc.Send(ctxT(t, 5*time.Second), []byte("x")); err != nil {
					t.Fatal(err)
				}
				ctx := &endingCtx{
					at: func() bool {
						s.mu.Lock()
						defer s.mu.Unlock()
						return sc.creditWait
					},
					end: func() { deviceLost(t, w.f.Node("10.0.87.1"), sc, s.Endpoint) },
				}
				if err := sc.Send(ctx, []byte("y")); !errors.Is(err, ErrDeviceRemoved) {
					t.Fatalf("Send waiting for a credit: %v, want ErrDeviceRemoved", err)
				}
				if ctx.Err() == nil {
					t.Fatal("the Send never waited for a credit: nothing was tested")
				}
			})
		}
	})
	t.Run("room", func(t *testing.T) {
		for i := range 64 {
			t.Run(fmt.Sprint(i), func(t *testing.T) {
				w := newWorld(t)
				w.f.AddNode("10.0.87.1", memfabric.NodeConfig{SendQueueDepth: 2})
				w.f.AddNode("10.0.87.2", memfabric.NodeConfig{SRQReceives: 4})
				s := w.endpoint("10.0.87.1", 7000, longTimers)
				r := w.endpoint("10.0.87.2", 7000, longTimers)
				sc, _ := pair(t, s, r)
				r.p.PauseReceives()
				t.Cleanup(r.p.ResumeReceives)
				// Four messages fill r's SRQ, two more wait (RNR) in s's
				// send queue of two: the seventh Send waits for room.
				for j := range 6 {
					if err := sc.Send(ctxT(t, 5*time.Second), seqMsg(j)); err != nil {
						t.Fatalf("Send %d: %v", j, err)
					}
				}
				ctx := &endingCtx{
					at: func() bool {
						s.mu.Lock()
						defer s.mu.Unlock()
						return sc.up.cur != nil && sc.up.cur.roomWait
					},
					end: func() { deviceLost(t, w.f.Node("10.0.87.1"), sc, s.Endpoint) },
				}
				if err := sc.Send(ctx, seqMsg(6)); !errors.Is(err, ErrDeviceRemoved) {
					t.Fatalf("Send waiting for room: %v, want ErrDeviceRemoved", err)
				}
				if ctx.Err() == nil {
					t.Fatal("the Send never waited for room: nothing was tested")
				}
			})
		}
	})
}

// A Recv whose context ends as its connection does says why the
// connection ended, as a Send does (above), and as it does when the
// connection ended before it looked: its wait answered context.Canceled
// whenever select took the context's end (14 of 32 Recvs in one run of the
// old code, found by helper 245).
func TestRecvWaitingEndedContextSaysWhyConnEnded(t *testing.T) {
	for i := range 32 {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			w := newWorld(t)
			s := w.endpoint("10.0.88.1", 7000, longTimers)
			r := w.endpoint("10.0.88.2", 7000, longTimers)
			_, rc := pair(t, s, r)
			ctx := &endingCtx{
				at:  func() bool { return true }, // Recv looks at Done only to wait
				end: func() { deviceLost(t, w.f.Node("10.0.88.2"), rc, r.Endpoint) },
			}
			if _, err := rc.Recv(ctx, make([]byte, 64)); !errors.Is(err, ErrDeviceRemoved) {
				t.Fatalf("Recv waiting for a message: %v, want ErrDeviceRemoved", err)
			}
			if ctx.Err() == nil {
				t.Fatal("the Recv never waited: nothing was tested")
			}
		})
	}
}
