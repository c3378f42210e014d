package cm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// stepEnd is a fake end whose blocking polls, while nonblock is set,
// return context.Canceled instead of sleeping: a call that would wait
// returns instead, so a test drives both sides from one goroutine. With
// timers set, its conn's timers that are armed fire now and then during a
// chain of receive reposts (when no completion is queued, so that the
// reaper's round reposts nothing itself), as they may on a device.
type stepEnd struct {
	*fakeEnd
	nonblock atomic.Bool
	c        *Conn
	timers   *rand.Rand
}

func (e *stepEnd) postRecvs(slots []int) error {
	if e.timers != nil && e.nonblock.Load() && e.timers.IntN(3) == 0 {
		e.w.mu.Lock()
		idle := len(e.cq) == 0
		e.w.mu.Unlock()
		if idle {
			fire(e.c, e.timers)
		}
	}
	return e.fakeEnd.postRecvs(slots)
}

func (e *stepEnd) poll(ctx context.Context, cs []completion, spin time.Duration, block bool) (int, error) {
	if !block || !e.nonblock.Load() {
		return e.fakeEnd.poll(ctx, cs, spin, block)
	}
	n, err := e.fakeEnd.poll(ctx, cs, spin, false)
	if n == 0 && err == nil {
		err = context.Canceled // it would sleep
	}
	return n, err
}

// stepEnds puts stepEnds (wrapped by wrap) under conns, with their
// timers run by hand, until the test ends.
func stepEnds(t *testing.T, r *rand.Rand, w *fakeWire, conns [2]*Conn, wrap func(i int, e *stepEnd) transport) {
	var ends [2]*stepEnd
	for i, c := range conns {
		ends[i] = &stepEnd{fakeEnd: w.ends[i], c: c, timers: rand.New(rand.NewPCG(r.Uint64(), 1))}
		ends[i].nonblock.Store(true)
		c.t = wrap(i, ends[i])
		handTimers(c)
	}
	t.Cleanup(func() { // before fakePair's: Close may wait
		for _, e := range ends {
			e.nonblock.Store(false)
		}
	})
}

// handTimers keeps c's reaper and persist timer from running on their own:
// their timers exist already, with a function that does nothing, so that
// arming them only sets reapArmed and persistArmed, and fire runs them.
func handTimers(c *Conn) {
	c.mu.Lock()
	c.reapTimer = time.AfterFunc(time.Hour, func() {})
	c.persistTimer = time.AfterFunc(time.Hour, func() {})
	c.persistDelay = minPersist
	c.mu.Unlock()
}

// fire runs the timers of c that are armed, as if their time had come, and
// reports whether any was.
func fire(c *Conn, r *rand.Rand) bool {
	c.mu.Lock()
	reap, persist := c.reapArmed, c.persistArmed
	c.mu.Unlock()
	first, second := c.reap, c.persist
	if r.IntN(2) == 0 {
		first, second = second, first
		reap, persist = persist, reap
	}
	if reap {
		first()
	}
	if persist {
		second()
	}
	return reap || persist
}

// The credit window, checked over random steps of two peers with small
// queues, all on this goroutine: each side sends, reads, half-closes, or
// does nothing (stops calling), and the timers (the reaper and the persist
// timer) fire when a step says so. After every step: no frame found the
// peer without a posted receive (the fake counts those), every credit is
// accounted for (the receiver's posted buffers are the sender's credits,
// the credits riding in frames not yet taken, those the receiver reposted
// and not yet returned, and its buffers past the window), and no side has
// more unread messages at its peer than the window. Messages arrive once
// each, in order. And a Send below the window that would wait goes
// through once the timers have fired, while the reader makes no call: no
// credit the reader's application freed stays owed for ever.
func TestConnCreditWindowRandomized(t *testing.T) {
	for seed := uint64(1); seed <= 60; seed++ {
		r := rand.New(rand.NewPCG(seed, 3))
		depth := [2]int{2 + r.IntN(3), 2 + r.IntN(3)}
		t.Run(fmt.Sprintf("seed%d/depth%d-%d", seed, depth[0], depth[1]), func(t *testing.T) {
			checkCreditWindow(t, r, depth, 300)
		})
	}
}

func checkCreditWindow(t *testing.T, r *rand.Rand, depth [2]int, steps int) {
	a, b, w := fakePair(t, fakeOpts{depth: depth})
	conns := [2]*Conn{a, b}
	stepEnds(t, r, w, conns, func(_ int, e *stepEnd) transport { return e })
	window := min(depth[0], depth[1])
	ctx := ctxT(t)
	var sent, got [2]uint32 // messages x sent, and x's that the peer read
	var finSent, eof [2]bool
	unread := func(x int) int { return int(sent[x] - got[x]) }
	state := func() string { return fmt.Sprintf("\n  a %s\n  b %s", connState(a), connState(b)) }
	check := func(step string) {
		t.Helper()
		requireNoRNR(t, w, step, state)
		requireCreditsAddUp(t, w, conns, window, unread, step, state)
	}
	buf := make([]byte, 256)
	for i := range steps {
		x := r.IntN(2)
		c, y := conns[x], conns[1-x]
		var step string
		switch k := r.IntN(20); {
		case k < 8: // send
			if finSent[x] || unread(x) == window {
				continue
			}
			step = fmt.Sprintf("step %d: side %d sends with %d unread", i, x, unread(x))
			msg := binary.BigEndian.AppendUint32([]byte{byte(x)}, sent[x])
			err := c.Send(ctx, msg)
			// Would wait: the peer's application makes no call; the
			// timers (both sides', as time passes) must let it through.
			for rounds := 0; errors.Is(err, context.Canceled); rounds++ {
				require.Less(t, rounds, 20, "%s: still waiting after 20 rounds of timers%s", step, state())
				fired := fire(c, r)
				fired = fire(y, r) || fired
				err = c.Send(ctx, msg)
				require.True(t, fired || err == nil, "%s: waits with no timer armed on either side%s", step, state())
			}
			require.NoError(t, err, step)
			sent[x]++
		case k < 14: // read
			step = fmt.Sprintf("step %d: side %d reads with %d unread", i, x, unread(1-x))
			if unread(1-x) == 0 {
				if !finSent[1-x] || eof[x] {
					continue
				}
				_, err := c.Recv(ctx, buf)
				require.ErrorIs(t, err, io.EOF, step)
				eof[x] = true
				break
			}
			n, err := c.Recv(ctx, buf)
			require.NoError(t, err, "%s%s", step, state())
			require.Equal(t, 5, n, step)
			require.Equal(t, byte(1-x), buf[0], step)
			require.Equal(t, got[1-x], binary.BigEndian.Uint32(buf[1:5]), "%s: a message lost or repeated", step)
			got[1-x]++
		case k < 19: // time passes for one side
			step = fmt.Sprintf("step %d: side %d's timers", i, x)
			fire(c, r)
		default: // half-close, rarely
			if finSent[x] || r.IntN(16) != 0 {
				continue
			}
			step = fmt.Sprintf("step %d: side %d half-closes", i, x)
			err := c.CloseWrite()
			for rounds := 0; errors.Is(err, context.Canceled); rounds++ {
				require.Less(t, rounds, 20, "%s: still waiting after 20 rounds of timers%s", step, state())
				fired := fire(c, r)
				fired = fire(y, r) || fired
				err = c.CloseWrite()
				require.True(t, fired || err == nil, "%s: waits with no timer armed on either side%s", step, state())
			}
			require.NoError(t, err, step)
			finSent[x] = true
		}
		check(step)
	}
}

// requireNoRNR requires that no frame found its peer without a posted
// receive buffer (the fake counts those) by the end of step.
func requireNoRNR(t *testing.T, w *fakeWire, step string, state func() string) {
	t.Helper()
	w.mu.Lock()
	rnr := w.rnr
	w.mu.Unlock()
	require.Zero(t, rnr, "a frame found no receive buffer after %s%s", step, state())
}

// requireCreditsAddUp requires, of two open Conns after step, that every
// credit is accounted for: a receiver's posted buffers are its sender's
// credits, those riding in frames not yet taken, those it reposted and
// has not returned yet, and its buffers past the window; and that no side
// has more unread messages at its peer than the window.
func requireCreditsAddUp(t *testing.T, w *fakeWire, conns [2]*Conn, window int, unread func(int) int, step string, state func() string) {
	t.Helper()
	w.mu.Lock()
	var inflight [2]int // credits in frames to x that x has not taken
	for x, e := range w.ends {
		for _, c := range e.cq {
			if c.op == compRecv && c.err == nil {
				inflight[x] += int(c.imm >> 16 & maxFrameCredits)
			}
		}
	}
	posted := [2]int{len(w.ends[0].posted), len(w.ends[1].posted)}
	w.mu.Unlock()
	for x, c := range conns {
		y := conns[1-x]
		require.LessOrEqual(t, unread(x), window, "side %d's unread messages after %s", x, step)
		c.mu.Lock()
		y.mu.Lock()
		want := c.credits + inflight[x] + y.pending + y.recvSlots - c.peerSlots
		y.mu.Unlock()
		c.mu.Unlock()
		require.Equal(t, want, posted[1-x],
			"side %d's posted buffers against side %d's credits, those in flight (%d), and those reposted, after %s%s",
			1-x, x, inflight[x], step, state())
	}
}
