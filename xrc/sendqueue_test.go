package xrc

import (
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goxrc/goxrc/xrc/memfabric"
)

// TestSendQueueFull: an INI's send queue holds max_send_wr sends until their
// completions are polled, and a post beyond that fails with ENOMEM. That is
// a device limit, not a failed INI: senders that meet it wait for the
// poller and post again. Eight connections share one INI whose queue holds
// one send; every message arrives once and in order, and the uplink is
// never rebuilt.
func TestSendQueueFull(t *testing.T) {
	w := newWorld(t)
	w.f.AddNode("10.0.2.1", memfabric.NodeConfig{SendQueueDepth: 1})
	a := w.endpoint("10.0.2.1", 7000)
	b := w.endpoint("10.0.2.2", 7000)
	const conns, msgs = 8, 300
	var senders, receivers [conns]*Conn
	for i := range conns {
		senders[i], receivers[i] = pair(t, a, b)
	}
	ctx := ctxT(t, 30*time.Second)
	// Whether two posts meet before the poller runs is up to the scheduler:
	// rounds until they have (one round in three misses on an idle host).
	const rounds = 50
	for r := range rounds {
		if err := streamAll(ctx, senders[:], receivers[:], r*msgs, (r+1)*msgs); err != nil {
			t.Fatalf("round %d: %v", r, err)
		}
		s := a.Stats()
		if s.Recoveries != 0 || s.Uplinks != 1 {
			t.Fatalf("round %d: a full send queue rebuilt the uplink: %+v", r, s)
		}
		if s.SendQueueFull > 0 {
			t.Logf("round %d: %d posts found the send queue full", r, s.SendQueueFull)
			return
		}
	}
	t.Fatalf("in %d rounds no post found the send queue full: nothing was tested", rounds)
}

// A Send waiting for room in a full send queue when its connection ends
// (here the peer's FIN, whose answer cannot go out while the Send holds the
// turn, so our side's close gives up after HandshakeTimeout) never posted
// its message: it must say so, not return nil as if the message were on
// its way.
func TestSendWaitingForRoomFailsWhenConnEnds(t *testing.T) {
	w := newWorld(t)
	w.f.AddNode("10.0.2.1", memfabric.NodeConfig{SendQueueDepth: 2})
	w.f.AddNode("10.0.2.2", memfabric.NodeConfig{SRQReceives: 4})
	short := func(c *Config) { longTimers(c); c.HandshakeTimeout = 200 * time.Millisecond }
	a := w.endpoint("10.0.2.1", 7000, short)
	b := w.endpoint("10.0.2.2", 7000, short)
	s, r := pair(t, a, b)
	b.p.PauseReceives() // four messages fill b's SRQ, the fifth waits (RNR) at a's INI
	ctx := ctxT(t, 10*time.Second)
	sent := make(chan error, 1)
	var inFlight atomic.Int32 // the Send under way
	go func() {
		for i := 0; ; i++ {
			inFlight.Store(int32(i))
			if err := s.Send(ctx, seqMsg(i)); err != nil {
				sent <- &failedSend{i, err}
				return
			}
			if i == 20 {
				sent <- errors.New("20 messages posted to a paused receiver through a send queue of 2")
				return
			}
		}
	}()
	eventually(t, "a Send finding the send queue full", func() (bool, string) {
		st := a.Stats()
		return st.SendQueueFull > 0, fmt.Sprintf("%+v", st)
	})
	waiting := int(inFlight.Load())
	go r.Close()
	err := <-sent
	var f *failedSend
	if !errors.As(err, &f) || f.i != waiting || !(errors.Is(err, ErrPeerClosed) || errors.Is(err, ErrClosed)) {
		t.Fatalf("Send %d waited for room as its connection ended; got %v, want it to fail with ErrPeerClosed or ErrClosed", waiting, err)
	}
	t.Log(err)
}

type failedSend struct {
	i   int
	err error
}

func (f *failedSend) Error() string { return fmt.Sprintf("send %d: %v", f.i, f.err) }
func (f *failedSend) Unwrap() error { return f.err }

// The same Send, woken by room in the queue just as its connection fails
// (both under one hold of the engine's lock, so the Send sees them
// together): the frame is still unposted, and Send must say why the
// connection ended. It returned nil (the room branch took a failed
// connection for a recovery that had taken the frame over: found by
// review, 20 rounds in 20).
func TestSendWokenByRoomAsConnFailsReportsIt(t *testing.T) {
	for round := range 5 {
		w := newWorld(t)
		w.f.AddNode("10.0.2.1", memfabric.NodeConfig{SendQueueDepth: 2})
		w.f.AddNode("10.0.2.2", memfabric.NodeConfig{SRQReceives: 4})
		a := w.endpoint("10.0.2.1", 7000, longTimers)
		b := w.endpoint("10.0.2.2", 7000, longTimers)
		s, _ := pair(t, a, b)
		b.p.PauseReceives()
		ctx := ctxT(t, 10*time.Second)
		sent := make(chan error, 1)
		var inFlight atomic.Int32
		go func() {
			for i := 0; ; i++ {
				inFlight.Store(int32(i))
				if err := s.Send(ctx, seqMsg(i)); err != nil || i == 50 {
					sent <- &failedSend{i, err}
					return
				}
			}
		}()
		var q *iniQP
		eventually(t, "a Send waiting for room", func() (bool, string) {
			a.mu.Lock()
			defer a.mu.Unlock()
			q = s.up.cur
			return q.roomWait, fmt.Sprintf("room wait %v, in flight %d", q.roomWait, inFlight.Load())
		})
		time.Sleep(50 * time.Millisecond) // it sleeps in its select by now
		waiting := int(inFlight.Load())
		gone := errors.New("the connection failed")
		a.mu.Lock()
		q.roomLocked()
		s.failLocked(gone)
		a.mu.Unlock()
		err := <-sent
		var f *failedSend
		if !errors.As(err, &f) || f.i != waiting || !errors.Is(err, gone) {
			t.Fatalf("round %d: Send %d waited for room as its connection failed; got %v, want it to fail with the connection's error", round, waiting, err)
		}
	}
}
