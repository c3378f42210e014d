package xrc

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
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
	var q *iniQP
	var polls0 uint64
	eventually(t, "the INI's posts polled", func() (bool, string) {
		a.mu.Lock()
		defer a.mu.Unlock()
		q, polls0 = s.up.cur, s.up.cur.polls
		return len(q.waiters) == 0, fmt.Sprintf("%d posts unpolled", len(q.waiters))
	})
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
	// A Send may find the queue full while completions of the first four
	// messages wait to be polled, and post once they are: the Send that
	// waits for good is one waiting for room after those four completions
	// were polled (no other can come).
	eventually(t, "a Send waiting for room with no completion to come", func() (bool, string) {
		a.mu.Lock()
		defer a.mu.Unlock()
		return q.roomWait && q.polls-polls0 >= 4, fmt.Sprintf("room wait %v, %d polled, in flight %d", q.roomWait, q.polls-polls0, inFlight.Load())
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

// roomWait is a Send waiting for room in a full send queue: a's queue
// holds 2 sends, b's SRQ 4 receives, and b's process has stopped polling,
// so the sends wait at a's INI (RNR) and a Send of the stream that
// sendsUntilRoomWait starts waits for room.
type roomWait struct {
	a, b *proc
	s, r *Conn
	q    *iniQP       // the INI whose queue is full
	sent chan error   // the stream's end: a *failedSend
	at   atomic.Int32 // the message being sent
}

// sendsUntilRoomWait pairs a and b (and pairs more times on the same
// uplink), streams up to 51 messages on the first connection with ctx, and
// returns once a Send of them waits for room (and sleeps in its select).
func sendsUntilRoomWait(t *testing.T, ctx context.Context, mod func(*Config), more int) *roomWait {
	t.Helper()
	w := newWorld(t)
	w.f.AddNode("10.0.2.1", memfabric.NodeConfig{SendQueueDepth: 2})
	w.f.AddNode("10.0.2.2", memfabric.NodeConfig{SRQReceives: 4})
	rw := &roomWait{a: w.endpoint("10.0.2.1", 7000, mod), b: w.endpoint("10.0.2.2", 7000, mod), sent: make(chan error, 1)}
	rw.s, rw.r = pair(t, rw.a, rw.b)
	for range more {
		pair(t, rw.a, rw.b)
	}
	rw.b.p.PauseReceives()
	t.Cleanup(rw.b.p.ResumeReceives)
	go func() {
		for i := 0; ; i++ {
			rw.at.Store(int32(i))
			if err := rw.s.Send(ctx, seqMsg(i)); err != nil || i == 50 {
				rw.sent <- &failedSend{i, err}
				return
			}
		}
	}()
	eventually(t, "a Send waiting for room", func() (bool, string) {
		rw.a.mu.Lock()
		defer rw.a.mu.Unlock()
		rw.q = rw.s.up.cur
		return rw.q.roomWait, fmt.Sprintf("room wait %v, in flight %d", rw.q.roomWait, rw.at.Load())
	})
	time.Sleep(50 * time.Millisecond) // it sleeps in its select by now
	return rw
}

// The same Send, woken by room in the queue just as its connection fails
// (both under one hold of the engine's lock, so the Send sees them
// together): the frame is still unposted, and Send must say why the
// connection ended. It returned nil (the room branch took a failed
// connection for a recovery that had taken the frame over: found by
// review, 20 rounds in 20).
func TestSendWokenByRoomAsConnFailsReportsIt(t *testing.T) {
	for round := range 5 {
		rw := sendsUntilRoomWait(t, ctxT(t, 10*time.Second), longTimers, 0)
		waiting := int(rw.at.Load())
		gone := errors.New("the connection failed")
		rw.a.mu.Lock()
		rw.q.roomLocked()
		rw.s.failLocked(gone)
		rw.a.mu.Unlock()
		err := <-rw.sent
		var f *failedSend
		if !errors.As(err, &f) || f.i != waiting || !errors.Is(err, gone) {
			t.Fatalf("round %d: Send %d waited for room as its connection failed; got %v, want it to fail with the connection's error", round, waiting, err)
		}
	}
}

// A Send waiting for room in a full send queue (the receiver's node
// stalled: RNR) when the application closes the connection. Close gives
// up on its FIN after HandshakeTimeout (the Send holds the turn) and
// returns; the Send must then fail with ErrClosed, not wait on for room
// that never comes (the receiving leg is still up, so the connection
// never finishes and c.done never closes). Found by review: it waited on,
// and after CloseWrite posted its message past the half-close.
func TestSendWaitingForRoomWokenByClose(t *testing.T) {
	for _, tc := range []struct {
		name  string
		close func(*Conn) error
	}{{"Close", (*Conn).Close}, {"CloseWrite", (*Conn).CloseWrite}} {
		t.Run(tc.name, func(t *testing.T) {
			short := func(c *Config) { longTimers(c); c.HandshakeTimeout = 200 * time.Millisecond }
			// Another connection on the uplink: Close does not tear it down.
			rw := sendsUntilRoomWait(t, ctxT(t, 10*time.Second), short, 1)
			start := time.Now()
			cerr := tc.close(rw.s)
			t.Logf("%s returned %v after %v", tc.name, cerr, time.Since(start))
			select {
			case err := <-rw.sent:
				if !errors.Is(err, ErrClosed) {
					t.Fatalf("Send waiting for room after %s: %v, want ErrClosed", tc.name, err)
				}
				t.Logf("send returned after %v: %v", time.Since(start), err)
			case <-time.After(2 * time.Second):
				t.Fatalf("Send waiting for room still blocked 2s after %s returned", tc.name)
			}
		})
	}
}

// A peer's credit frame that counts the message a Send has
// numbered but not yet posted (it waits for room in a full send queue) is
// capped at sent, which includes that message; the Send then gives up
// (its context ends) and takes its credit back (sent--), leaving acked
// one past sent. From then on sent-acked is ~2^32: the connection never
// sends again, and the next credit frame may move acked anywhere (the cap
// sent-acked no longer caps anything). Found by review; now the take-back
// keeps acked at sent.
func TestCreditTakenBackNeverPastSent(t *testing.T) {
	sendCtx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rw := sendsUntilRoomWait(t, sendCtx, longTimers, 0)
	a, s, r, sent := rw.a, rw.s, rw.r, rw.sent
	a.mu.Lock()
	n := s.sent // includes the message waiting for room
	a.mu.Unlock()
	var body [4]byte
	binary.BigEndian.PutUint32(body[:], n)
	if err := r.sendFrame(ctxT(t, 5*time.Second), kindCredit, body[:]); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the credit frame taken", func() (bool, string) {
		a.mu.Lock()
		defer a.mu.Unlock()
		return s.acked == n, fmt.Sprint(s.acked)
	})
	cancel()
	if err := <-sent; !errors.Is(err, context.Canceled) {
		t.Fatalf("the waiting Send: %v, want context.Canceled", err)
	}
	a.mu.Lock()
	sentN, acked := s.sent, s.acked
	a.mu.Unlock()
	if int32(sentN-acked) < 0 {
		t.Fatalf("acked %d is past sent %d: %d credits", acked, sentN, credits(s))
	}
}

// A CloseWrite whose FIN found no room before its handshake timeout (the
// receiver's node stalled) returns that error, and has sent nothing: a
// second CloseWrite, once there is room, must send it. It returned nil
// instead (found by review), and the peer, having read every message,
// waited for an end of stream that came only with Close.
func TestCloseWriteAgainAfterItsFINFoundNoRoom(t *testing.T) {
	short := func(c *Config) { longTimers(c); c.HandshakeTimeout = 200 * time.Millisecond }
	ctx := ctxT(t, 10*time.Second)
	rw := sendsUntilRoomWait(t, ctx, short, 1)
	if err := rw.s.CloseWrite(); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("setup: CloseWrite with its FIN behind a full send queue: %v, want a deadline", err)
	}
	var f *failedSend
	if err := <-rw.sent; !errors.As(err, &f) || !errors.Is(err, ErrClosed) {
		t.Fatalf("setup: the Send waiting for room: %v, want ErrClosed", err)
	}
	rw.b.p.ResumeReceives()
	if err := rw.s.CloseWrite(); err != nil {
		t.Fatalf("CloseWrite again, with room: %v", err)
	}
	if err := recvSeq(ctx, rw.r, 0, f.i, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := rw.r.Recv(ctxT(t, 5*time.Second), make([]byte, 64)); err != io.EOF {
		t.Fatalf("after the last message: Recv says %v, want io.EOF", err)
	}
}
