package xrc

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// TestSendWaitingForRoomSaysProcessDeathFromKillOn: a Send waiting for
// room in a full send queue at the Kill, its ctx ending after it, says
// ErrProcessDied, as the credit wait does and as after die (c.done). It
// said ctx's error.
func TestSendWaitingForRoomSaysProcessDeathFromKillOn(t *testing.T) {
	for _, tc := range []struct {
		name       string
		closeFirst bool
		want       error
	}{{"Kill", false, ErrProcessDied}, {"CloseThenKill", true, ErrClosed}} {
		t.Run(tc.name, func(t *testing.T) {
			a, s, sent, waiting, cancel := sendWaitingForRoomHeld(t)
			if tc.closeFirst {
				// Close's FIN waits for the turn, which the Send holds.
				go a.Close()
				eventually(t, "the endpoint's Close begun", func() (bool, string) {
					a.mu.Lock()
					defer a.mu.Unlock()
					return a.closed, ""
				})
			}
			a.p.Kill()
			if !tc.closeFirst {
				cancel()
			}
			// That Send's own error: nil would pass its message, never
			// posted, for sent.
			err := <-sent
			if f := (*failedSend)(nil); !errors.As(err, &f) || f.i != waiting || !errors.Is(err, tc.want) {
				t.Errorf("Send %d waiting for room at the process's kill: %v, want %v (Err: %v)", waiting, err, tc.want, s.Err())
			}
		})
	}
}

// sendWaitingForRoomHeld streams messages on a connection from an endpoint
// whose kernel holds back its loops' news of its process's death (see
// deathHeldKernel) to a receiver that takes nothing, and returns once a
// Send of them (the waiting-th) waits for room in the full send queue; sent
// gets the stream's error (a *failedSend), cancel ends its ctx.
func sendWaitingForRoomHeld(t *testing.T) (a *proc, s *Conn, sent chan error, waiting int, cancel func()) {
	w := newWorld(t)
	w.f.AddNode("10.0.193.1", memfabric.NodeConfig{SendQueueDepth: 2})
	w.f.AddNode("10.0.193.2", memfabric.NodeConfig{SRQReceives: 4})
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	a = w.wrappedEndpoint("10.0.193.1", 7000, func(k kernel.Kernel) kernel.Kernel {
		return deathHeldKernel{wrapper{k}, k.(interface{ Dead() <-chan struct{} }).Dead(), release}
	}, longTimers)
	b := w.endpoint("10.0.193.2", 7000, longTimers)
	s, _ = pair(t, a, b)
	b.p.PauseReceives() // four messages fill b's SRQ, the next wait (RNR) at a's INI
	t.Cleanup(b.p.ResumeReceives)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	sent = make(chan error, 1)
	var at atomic.Int32 // the Send under way
	go func() {
		for i := 0; i < 50; i++ {
			at.Store(int32(i))
			if err := s.Send(ctx, seqMsg(i)); err != nil {
				sent <- &failedSend{i, err}
				return
			}
		}
		sent <- errors.New("50 messages posted to a paused receiver through a send queue of 2")
	}()
	eventually(t, "a Send waiting for room", func() (bool, string) {
		a.mu.Lock()
		defer a.mu.Unlock()
		return s.up.cur.roomWait, fmt.Sprintf("room wait %v", s.up.cur.roomWait)
	})
	return a, s, sent, int(at.Load()), cancel
}
