package xrc

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// delayMoves holds each MOVE request (PHYS_REQ or VIRT_REQ flagged MOVE)
// the engine reads for d: a live receiver slow to answer its CM events.
type delayMoves struct {
	kernel.Kernel
	d     time.Duration
	moves atomic.Int32
}

func (g *delayMoves) Event(ctx context.Context, id kernel.ID) (kernel.Event, error) {
	ev, err := g.Kernel.Event(ctx, id)
	if err == nil && isMoveRequest(ev) {
		g.moves.Add(1)
		select {
		case <-time.After(g.d):
		case <-ctx.Done():
		}
	}
	return ev, err
}

// A live sender whose uplink recovers (REPLACES_TGT onto a new TGT, its
// legs moved, its old INI DREQ'd) must not see the legs it sends on failed
// at a receiver, errStaleLink (the DREQ's verdict, d79cf47/9694af2) or any
// other, even where the receiver takes its MOVEs late (past several of its
// janitor's looks and past a heartbeat) and its idle timeout is short. One
// of the connections was half-closed by the sender before the recovery: a
// verdict of errStaleLink there would even be silent (Err nil).
func TestLiveSenderRecoveryFailsNoReceivingLeg(t *testing.T) {
	t.Run("recovery", func(t *testing.T) { liveSenderRecovery(t, false) })
	t.Run("control", func(t *testing.T) { liveSenderRecovery(t, true) })
}

func liveSenderRecovery(t *testing.T, noRecovery bool) {
	w := newWorld(t)
	short := func(c *Config) { c.Heartbeat, c.IdleTimeout = 100*time.Millisecond, time.Second }
	// r1 takes its MOVEs one after another, each 200 ms late: within the
	// sender's MOVE budget (its IdleTimeout/2, 2 s), past two of r1's
	// heartbeats and four of its janitor's looks.
	g := &delayMoves{d: 200 * time.Millisecond}
	s := w.endpoint("10.0.169.1", 7000, func(c *Config) { c.Heartbeat, c.IdleTimeout = 100*time.Millisecond, 4*time.Second })
	r1 := w.wrappedEndpoint("10.0.169.2", 7001, func(k kernel.Kernel) kernel.Kernel { g.Kernel = k; return g }, short)
	r3 := w.endpoint("10.0.169.2", 7003, short)
	sa, ra := pair(t, s, r1) // r1 makes the TGT; sa's MOVE is the PHYS_REQ
	sb, rb := pair(t, s, r1) // a VIRT_REQ MOVE
	sh, rh := pair(t, s, r1) // half-closed by s before the recovery
	s3, _ := pair(t, s, r3)
	roundTrip(t, sa, ra, []byte("a"))
	roundTrip(t, sb, rb, []byte("b"))
	if err := sh.Send(ctxT(t, 5*time.Second), []byte("h")); err != nil {
		t.Fatal(err)
	}
	if err := sh.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	eventually(t, "r1 took the half FIN", func() (bool, string) {
		r1.mu.Lock()
		defer r1.mu.Unlock()
		return rh.finRcvd, ""
	})
	// Watch r1's connections for a DREQ verdict or any failure.
	var mu sync.Mutex
	var seen []string
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-time.After(5 * time.Millisecond):
			}
			r1.mu.Lock()
			for name, c := range map[string]*Conn{"a": ra, "b": rb, "h": rh} {
				if !c.goneAt.IsZero() || c.err != nil {
					x := name + ": goneAt " + c.goneAt.Format("15:04:05.000") + " err " + errString(c.err)
					mu.Lock()
					if len(seen) == 0 || seen[len(seen)-1] != x {
						seen = append(seen, x)
					}
					mu.Unlock()
				}
			}
			r1.mu.Unlock()
		}
	}()
	recs, moved := s.Stats().Recoveries, s.Stats().LegsMoved
	if noRecovery {
		time.Sleep(2 * time.Second)
		close(stop)
		<-done
		t.Logf("no recovery: seen %v", seen)
		roundTrip(t, rh, sh, []byte("after h, back"))
		return
	}
	r3.p.Kill()
	if err := sendErr(t, s3); !errors.Is(err, ErrPeerGone) {
		t.Fatalf("to the dead r3: %v", err)
	}
	t.Logf("recovery began %s", time.Now().Format("15:04:05.000"))
	eventually(t, "the recovery ended with the uplink up", func() (bool, string) {
		st, _ := upOf(s, sa)
		st2 := s.Stats()
		return st2.Recoveries > recs && st == upUp && st2.LegsMoved-moved >= 3, st.String()
	})
	t.Logf("recovery ended %s: s %+v", time.Now().Format("15:04:05.000"), s.Stats())
	time.Sleep(2 * time.Second) // two of r1's idle timeouts: the old INI's DREQ came and any verdict with it
	close(stop)
	<-done
	mu.Lock()
	if len(seen) > 0 {
		t.Errorf("a live sender's recovery marked or failed r1's receiving legs (%d MOVEs taken): %v", g.moves.Load(), seen)
	}
	mu.Unlock()
	roundTrip(t, sa, ra, []byte("after a"))
	roundTrip(t, sb, rb, []byte("after b"))
	roundTrip(t, rh, sh, []byte("after h, back")) // the half-closed peer still takes data
	buf := make([]byte, 16)
	if n, err := rh.Recv(ctxT(t, 5*time.Second), buf); err != nil || string(buf[:n]) != "h" {
		t.Fatalf("rh: %q %v", buf[:n], err)
	}
	if _, err := rh.Recv(ctxT(t, 5*time.Second), buf); !errors.Is(err, io.EOF) {
		t.Fatalf("rh after its data: %v, want io.EOF", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) > 0 {
		t.Fatalf("a live sender's recovery marked or failed r1's receiving legs (%d MOVEs taken): %v", g.moves.Load(), seen[:min(len(seen), 6)])
	}
}

func errString(err error) string {
	if err == nil {
		return "nil"
	}
	return err.Error()
}
