package xrc

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// finWaitsForTurn reports whether a goroutine posting an internal frame
// (CloseWrite's FIN here) waits for its connection's turn.
func finWaitsForTurn() bool {
	buf := make([]byte, 1<<20)
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if strings.Contains(g, "(*Conn).takeTurn") && strings.Contains(g, "(*Conn).sendFrameNotify") {
			return true
		}
	}
	return false
}

// A CloseWrite whose FIN waits for the connection's turn (held by a Send
// posting, or waiting for room in a full send queue) when the connection
// ends says why it ended, as a CloseWrite called a moment later does: the
// device's loss (ErrDeviceRemoved), the peer's death (ErrPeerGone). It said
// ErrClosed: the turn's wait answers with the Send's error, and a Send after
// CloseWrite is ErrClosed, which cm takes for the application's Close. The
// FIN's other waits (for room, for the uplink) answered the same ends with
// ErrClosed or the connection's error, as select picked the endpoint's end
// (or the FIN's context, made from it) or the connection's.
func TestCloseWriteWaitingForTurnSaysWhyItEnded(t *testing.T) {
	for _, tc := range []struct {
		name string
		want error
	}{{"device lost", ErrDeviceRemoved}, {"peer killed", ErrPeerGone}} {
		t.Run(tc.name, func(t *testing.T) {
			w := newWorld(t)
			s, r := w.endpoint("10.0.83.1", 7000), w.endpoint("10.0.83.2", 7001)
			sc, rc := pair(t, s, r)
			roundTrip(t, sc, rc, []byte("up"))
			sc.turn <- struct{}{} // held, as by a Send posting
			res := make(chan error, 1)
			go func() { res <- sc.CloseWrite() }()
			eventually(t, "CloseWrite's FIN waits for the turn", func() (bool, string) { return finWaitsForTurn(), "" })
			if tc.want == ErrDeviceRemoved {
				w.f.Node("10.0.83.1").FailDevice()
				<-s.ctx.Done()
			} else {
				r.p.Kill() // our side finds it silent at its idle timeout
			}
			select {
			case <-sc.done:
			case <-time.After(5 * time.Second):
				t.Fatal("the connection never ended")
			}
			var err error
			select {
			case err = <-res:
			case <-time.After(5 * time.Second):
				t.Fatal("CloseWrite never returned")
			}
			<-sc.turn
			if !errors.Is(err, tc.want) {
				t.Fatalf("CloseWrite whose FIN waited for the turn: %v, want %v", err, tc.want)
			}
			if err := sc.CloseWrite(); !errors.Is(err, tc.want) {
				t.Fatalf("CloseWrite after: %v, want %v", err, tc.want)
			}
		})
	}
}

// lateFullFIN makes, once armed, the next FIN's PostSend find the send
// queue full (ENOMEM, nothing posted) and return only once letPost closes:
// the goroutine that posted it is late to wait for room, as a preempted one
// is. With holdPolls, a send poll that fails (the endpoint closing) returns
// only once letPolls closes: it would flush the FIN's waiter, and the post
// then take the INI for failed and wait for nothing.
type lateFullFIN struct {
	wrapper
	armed     atomic.Bool
	holdPolls atomic.Bool
	atPost    chan struct{}
	letPost   chan struct{}
	pollHeld  chan struct{}
	heldOnce  sync.Once
	letPolls  chan struct{}
}

func (k *lateFullFIN) PostSend(q kernel.QP, wrs []kernel.SendWR) error {
	if wrs[0].Payload[0] == kindFIN && k.armed.CompareAndSwap(true, false) {
		close(k.atPost)
		<-k.letPost
		return syscall.ENOMEM
	}
	return k.Kernel.PostSend(q, wrs)
}

func (k *lateFullFIN) PollSend(ctx context.Context, q kernel.QP, out []kernel.SendCompletion) (int, error) {
	n, err := k.Kernel.PollSend(ctx, q, out)
	if err != nil && k.holdPolls.Load() {
		k.heldOnce.Do(func() { close(k.pollHeld) })
		<-k.letPolls
	}
	return n, err
}

// A CloseWrite whose FIN, late to wait for room in a full send queue, finds
// its connection ended by the device's loss and the endpoint closed with it
// says ErrDeviceRemoved, as a CloseWrite called then does. It said
// ErrClosed whenever select took the endpoint's end, or the FIN's context
// (made from the endpoint's), over the connection's end or the room: each
// round below failed with odds of 1 in 2.
func TestCloseWriteLateForRoomSaysDeviceRemoved(t *testing.T) {
	w := newWorld(t)
	const rip = "10.0.84.2"
	w.f.AddNode(rip, memfabric.NodeConfig{SRQReceives: 1})
	const rounds = 16
	for i := range rounds {
		k := &lateFullFIN{atPost: make(chan struct{}), letPost: make(chan struct{}),
			pollHeld: make(chan struct{}), letPolls: make(chan struct{})}
		sip := fmt.Sprintf("10.0.84.%d", 10+i)
		s := w.wrappedEndpoint(sip, 7000, func(kk kernel.Kernel) kernel.Kernel { k.Kernel = kk; return k })
		r := w.endpoint(rip, 7000+i)
		sc, rc := pair(t, s, r)
		roundTrip(t, sc, rc, []byte("up"))
		// A frame waits at our INI for a receive (the receiver paused,
		// its one receive taken): the send queue holds a frame.
		r.p.PauseReceives()
		for j := range 2 {
			if err := sc.Send(ctxT(t, 5*time.Second), []byte{byte(j)}); err != nil {
				t.Fatalf("round %d: send %d: %v", i, j, err)
			}
		}
		k.armed.Store(true)
		k.holdPolls.Store(true)
		res := make(chan error, 1)
		go func() { res <- sc.CloseWrite() }()
		<-k.atPost
		w.f.Node(sip).FailDevice()
		<-sc.done
		<-s.ctx.Done()
		select {
		case <-k.pollHeld:
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d: the send poll never failed", i)
		}
		// The FIN's post returns ENOMEM now; the wait for room that
		// follows finds the connection's and the endpoint's ends ready.
		close(k.letPost)
		var err error
		select {
		case err = <-res:
		case <-time.After(5 * time.Second):
			t.Fatalf("round %d: CloseWrite never returned", i)
		}
		close(k.letPolls) // the endpoint's Close waits for the polls
		r.p.ResumeReceives()
		if !errors.Is(err, ErrDeviceRemoved) {
			t.Fatalf("round %d: CloseWrite late to wait for room: %v, want ErrDeviceRemoved", i, err)
		}
	}
}
