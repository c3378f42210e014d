package model

import (
	"context"
	"errors"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// Rule (model): a poll that returns its deadline's error found the queue
// empty. A paused process's poll whose deadline passes as ResumeReceives
// runs had only looked at the pause, never at the SRQ, where a message
// waits: it returns EINTR or the message, never the deadline. The model
// looked again at its deadline, saw the pause over and said the SRQ was
// empty; the receive loop took that for a drain and failed a connection
// whose FIN waited on the SRQ (TestPausedReceiverKeepsQueuedFIN's flake in
// the VM, 4 in 40 runs).
func TestModelPausedPollDeadlineAtResume(t *testing.T) {
	_, a, b := twoNodes(t, ReuseNever)
	pa, pb := newSide(t, a, domainFile(t)), newSide(t, b, domainFile(t))
	k := physLink(t, pa, pb, listen(t, pb.p, kernel.ExchangeXRC))
	var r [1]kernel.RecvCompletion
	for i := range 500 {
		pb.p.PauseReceives()
		if c := send(t, pa.p, k.ini, pb.srqn, uint32(i), "queued"); c.Status != 0 {
			t.Fatalf("send %d: status %v", i, c.Status)
		}
		d := time.Duration(20+rand.IntN(60)) * time.Microsecond
		ctx, cancel := context.WithTimeout(context.Background(), d)
		go func() {
			time.Sleep(time.Duration(rand.IntN(100)) * time.Microsecond)
			pb.p.ResumeReceives()
		}()
		for {
			n, err := pb.p.PollRecv(ctx, pb.srq, r[:])
			if errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("poll %d said the SRQ was empty (%v) with a message on it", i, err)
			}
			if n == 1 {
				break
			}
			if !errors.Is(err, syscall.EINTR) {
				t.Fatalf("poll %d: %d, %v", i, n, err)
			}
			// Held at its deadline: look again, as the receive loop does.
			cancel()
			ctx, cancel = context.WithTimeout(context.Background(), time.Second)
		}
		cancel()
		if r[0].Imm != uint32(i) {
			t.Fatalf("poll %d got message %d", i, r[0].Imm)
		}
		kernel.FreePayload(r[0].Payload)
	}
}
