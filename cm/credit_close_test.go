package cm

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// closeEnd is a stepEnd whose blocking polls, while a Close runs on the
// test's goroutine, call wait instead of returning context.Canceled: wait
// lets time pass (fires timers) and reports whether the poll should look
// again. Like the fake's own poll, a wake-up after a shutdown or an
// interrupt with nothing to complete returns at once.
type closeEnd struct {
	*stepEnd
	wait        func() bool
	onInterrupt func() // runs before interrupt (Close wakes its blocked calls)
}

func (e *closeEnd) interrupt() {
	if e.onInterrupt != nil {
		e.onInterrupt()
	}
	e.stepEnd.interrupt()
}

func (e *closeEnd) poll(ctx context.Context, cs []completion, spin time.Duration, block bool) (int, error) {
	if !block || !e.nonblock.Load() {
		return e.stepEnd.poll(ctx, cs, spin, block)
	}
	n, err := e.fakeEnd.poll(ctx, cs, spin, false)
	if n > 0 || err != nil {
		return n, err
	}
	select {
	case <-e.notify:
		if e.wokeIdle() {
			return 0, nil
		}
		if n, err := e.fakeEnd.poll(ctx, cs, spin, false); n > 0 || err != nil {
			return n, err
		}
	default:
	}
	if e.wait != nil && e.wait() {
		return 0, nil
	}
	return 0, context.Canceled // it would sleep
}

// randCloseSeeds is how many seeds TestConnCloseRandomized draws in a
// normal run; GOXRC_CLOSE_SEEDS=N draws N, GOXRC_CLOSE_SEED=S starts at S
// (alone, it runs seed S only).
const randCloseSeeds = 600

// TestConnCloseRandomized is TestConnCreditWindowRandomized with Close: on
// one goroutine, each side sends (messages up to the largest size), reads,
// half-closes, lets its timers fire, or closes, at any step: while the
// other side is blocked on credit or mid-CloseWrite (a call that would
// wait is left pending and resumed later, as the blocked call would go
// on), with messages unread either way and credit frames in flight; and
// while a Close waits, or wakes its calls, the peer's application sends,
// reads, half-closes or closes too (both sides closing at once). Depth 1
// is not drawn: neither WithQueueDepth nor the handshake takes it. A
// Close must return with only timers firing (no wait for its timeout); the
// other side reads every message sent before it, then io.EOF; blocked and
// later calls end as the documentation says (ErrClosed on the closed side,
// ErrPeerGone or a lost message on the other); credits never go negative
// or past the window; nothing counts as an error (every end is graceful);
// and both Conns are released (their transports, the open-connection
// count).
func TestConnCloseRandomized(t *testing.T) {
	first, n := seedRange(t, "GOXRC_CLOSE", randCloseSeeds)
	sizes := []int{5, 64, 256, 4096, 64 << 10}
	for seed := first; seed < first+n; seed++ {
		r := rand.New(rand.NewPCG(seed, 5))
		depth := [2]int{2 + r.IntN(6), 2 + r.IntN(6)}
		size := [2]int{sizes[r.IntN(len(sizes))], sizes[r.IntN(len(sizes))]}
		t.Run(fmt.Sprintf("seed%d/depth%d-%d/size%d-%d", seed, depth[0], depth[1], size[0], size[1]), func(t *testing.T) {
			checkCreditClose(t, r, depth, size, 200)
		})
	}
}

func checkCreditClose(t *testing.T, r *rand.Rand, depth, size [2]int, steps int) {
	open := GlobalStats().ConnectionsOpen
	a, b, w := fakePair(t, fakeOpts{depth: depth, msgSize: size})
	conns := [2]*Conn{a, b}
	var ends [2]*closeEnd
	stepEnds(t, r, w, conns, func(i int, e *stepEnd) transport {
		ends[i] = &closeEnd{stepEnd: e}
		return ends[i]
	})
	window := min(depth[0], depth[1])
	maxSend := a.MaxMessageSize()
	ctx := ctxT(t)
	var sent, got [2]uint32 // messages x sent, and x's that the peer read
	var (
		finSent  [2]bool // x's FIN is posted (CloseWrite returned nil, or Close)
		cwCalled [2]bool // x called CloseWrite: Send says ErrClosed
		eof      [2]bool // x read io.EOF
		closed   [2]bool
		sendWait [2][]byte // x's Send that would wait, to resume
		cwWait   [2]bool   // x's CloseWrite that would wait, to resume
	)
	// A side reads at 2 or 10 steps in 40: a slow reader keeps its peer
	// short of credit.
	reads := [2]int{2 + 8*r.IntN(2), 2 + 8*r.IntN(2)}
	unread := func(x int) int { return int(sent[x] - got[x]) }
	state := func() string { return fmt.Sprintf("\n  a %s\n  b %s", connState(a), connState(b)) }
	anyClosed := func() bool { return closed[0] || closed[1] }
	// outOfBounds names a side whose credits or buffers are out of
	// bounds; Close checks it while it waits too.
	outOfBounds := func() string {
		for x, c := range conns {
			c.mu.Lock()
			credits, pending, deferred, ready, free := c.credits, c.pending, len(c.deferred), c.ready.Len(), len(c.freeSend)
			c.mu.Unlock()
			if credits < 0 || credits > c.peerSlots || pending < 0 || pending+deferred > c.recvSlots ||
				ready > c.recvSlots || free > cap(c.freeSend) {
				return fmt.Sprintf("side %d's accounting out of bounds", x)
			}
		}
		return ""
	}
	check := func(step string) {
		t.Helper()
		requireNoRNR(t, w, step, state)
		require.Empty(t, outOfBounds(), "after %s%s", step, state())
		if !anyClosed() { // else the flushes took the posted buffers
			requireCreditsAddUp(t, w, conns, window, unread, step, state)
		}
	}
	// untilDone repeats call, firing both sides' timers between tries,
	// while it would wait; it fails if it waits with no timer armed, or
	// for 20 rounds.
	untilDone := func(step string, x int, call func() error) error {
		t.Helper()
		err := call()
		for rounds := 0; errors.Is(err, context.Canceled); rounds++ {
			require.Less(t, rounds, 20, "%s: still waiting after 20 rounds of timers%s", step, state())
			fired := fire(conns[x], r)
			fired = fire(conns[1-x], r) || fired
			err = call()
			require.True(t, fired || err == nil, "%s: waits with no timer armed on either side%s", step, state())
		}
		return err
	}
	msg := func(x int, seq uint32) []byte {
		n := maxSend
		if r.IntN(4) != 0 {
			n = 5 + r.IntN(maxSend-4)
		}
		p := binary.BigEndian.AppendUint32([]byte{byte(x)}, seq)
		for i := len(p); i < n; i++ {
			p = append(p, byte(seq*7+uint32(i)))
		}
		return p
	}
	buf := make([]byte, a.MaxRecvSize())
	// recvOK checks a message x read: the next of the peer's, intact.
	recvOK := func(step string, x, n int) {
		t.Helper()
		y := 1 - x
		require.GreaterOrEqual(t, n, 5, step)
		require.Equal(t, byte(y), buf[0], step)
		require.Equal(t, got[y], binary.BigEndian.Uint32(buf[1:5]), "%s: a message lost or repeated", step)
		for i := 5; i < n; i++ {
			if buf[i] != byte(got[y]*7+uint32(i)) {
				t.Fatalf("%s: byte %d of %d is %d", step, i, n, buf[i])
			}
		}
		got[y]++
	}
	// sendDone records how x's Send (or a resumed one) ended.
	sendDone := func(step string, x int, err error) {
		t.Helper()
		switch {
		case closed[x] || cwCalled[x]:
			require.ErrorIs(t, err, ErrClosed, step)
		case closed[1-x]:
			// Lost with the peer (as on a TCP socket), or refused.
			if err != nil {
				require.ErrorIs(t, err, ErrPeerGone, step)
			}
		default:
			require.NoError(t, err, "%s%s", step, state())
			sent[x]++
		}
	}
	var doStep func(i, x int, nested bool) string
	var closing [2]bool // x is in Close
	// finAtOnce reports whether x's FIN would go at once (a credit, a send
	// slot, and no buffers of the peer's to repost first).
	finAtOnce := func(x int) bool {
		c := conns[x]
		c.mu.Lock()
		defer c.mu.Unlock()
		ok := len(c.freeSend) > 0 && (c.credits >= 2 || c.credits == 1 && len(c.deferred)+c.reposting == 0)
		w.mu.Lock()
		defer w.mu.Unlock()
		return ok && !w.ends[1-x].shut // else the FIN is retried until the peer's disconnect
	}
	closeSide := func(step string, x int) {
		t.Helper()
		c, y := conns[x], conns[1-x]
		stuck, bad := false, ""
		rounds := 0
		closing[x] = true
		defer func() { closing[x] = false }()
		peerSteps := func() {
			c.mu.Lock()
			if c.finPosted && !closed[1-x] {
				finSent[x] = true // the peer may read it now
			}
			c.mu.Unlock()
			// Now and then the peer's application calls meanwhile.
			for !closed[1-x] && !closing[1-x] && r.IntN(2) == 0 {
				doStep(-1, 1-x, true)
			}
		}
		ends[x].onInterrupt = peerSteps
		ends[x].wait = func() bool {
			peerSteps()
			// Time passes while Close waits: both sides' timers fire
			// (our own are stopped by then).
			fired := fire(y, r)
			fired = fire(c, r) || fired
			rounds++
			if bad == "" {
				bad = outOfBounds()
			}
			if !fired || rounds > 40 {
				stuck = true
				return false
			}
			return true
		}
		err := c.Close()
		ends[x].wait, ends[x].onInterrupt = nil, nil
		require.NoError(t, err, step)
		require.Empty(t, bad, "%s: while Close waited%s", step, state())
		require.False(t, stuck, "%s: Close would wait for its timeout (%d rounds of timers)%s", step, rounds, state())
		closed[x] = true
		if !finSent[x] && !closed[1-x] {
			finSent[x] = true
		}
		select {
		case <-c.freed:
		default:
			t.Fatalf("%s: Close returned unreleased", step)
		}
		w.mu.Lock()
		released := w.ends[x].released
		w.mu.Unlock()
		require.True(t, released, "%s: transport not released", step)
	}
	// doStep draws and takes a step of side x: as a step of its own, or
	// (nested) while the peer's Close waits, where a call of x's that
	// would wait is left pending (the peer makes no progress meanwhile),
	// and x closes only if its FIN needs nothing of the peer's.
	doStep = func(i, x int, nested bool) string {
		c := conns[x]
		var step string
		k := r.IntN(40)
		if k >= 14 && k < 24 && k-14 >= reads[x] {
			k = r.IntN(14) // a slow reader sends instead
		}
		if nested && r.IntN(8) == 0 {
			k = 39 // both sides close at once
		}
		switch {
		case k < 14: // send, or resume a send that would wait
			full := !closed[x] && !cwCalled[x] && !closed[1-x] && unread(x) == window
			if p := sendWait[x]; p != nil {
				if full || nested {
					return "" // until the peer reads
				}
				step = fmt.Sprintf("step %d: side %d resumes a send", i, x)
				sendWait[x] = nil
				sendDone(step, x, untilDone(step, x, func() error { return c.Send(ctx, p) }))
				break
			}
			step = fmt.Sprintf("step %d: side %d sends with %d unread", i, x, unread(x))
			p := msg(x, sent[x])
			err := c.Send(ctx, p)
			if full {
				// The peer's buffers are all its unread messages.
				require.ErrorIs(t, err, context.Canceled, "%s: a send past the window%s", step, state())
				sendWait[x] = p
				step += " (waits)"
				break
			}
			if errors.Is(err, context.Canceled) {
				if nested || r.IntN(4) != 0 { // blocked: resumed later
					sendWait[x] = p
					step += " (would wait)"
					break
				}
				err = untilDone(step, x, func() error { return c.Send(ctx, p) })
			}
			sendDone(step, x, err)
		case k < 24: // read
			step = fmt.Sprintf("step %d: side %d reads with %d unread", i, x, unread(1-x))
			n, err := c.Recv(ctx, buf)
			switch {
			case closed[x]:
				require.ErrorIs(t, err, ErrClosed, step)
			case unread(1-x) > 0:
				require.NoError(t, err, "%s%s", step, state())
				recvOK(step, x, n)
			case finSent[1-x]:
				require.ErrorIs(t, err, io.EOF, "%s%s", step, state())
				eof[x] = true
			default: // blocked: nothing to read
				require.ErrorIs(t, err, context.Canceled, "%s%s", step, state())
			}
		case k < 34: // time passes for one side
			step = fmt.Sprintf("step %d: side %d's timers", i, x)
			fire(c, r)
		case k < 38: // half-close, or resume one that would wait
			c.mu.Lock()
			short := c.credits < 2 // its FIN may wait
			c.mu.Unlock()
			if !cwWait[x] && (cwCalled[x] || !short && r.IntN(4) != 0) || nested && cwWait[x] {
				return ""
			}
			step = fmt.Sprintf("step %d: side %d half-closes", i, x)
			if cwWait[x] {
				step = fmt.Sprintf("step %d: side %d resumes a half-close", i, x)
			}
			resumed := cwWait[x]
			cwWait[x] = false
			err := c.CloseWrite()
			if errors.Is(err, context.Canceled) && (nested || !resumed && r.IntN(2) == 0) {
				cwCalled[x], cwWait[x] = true, true
				step += " (would wait)"
				break
			}
			err = untilDone(step, x, func() error {
				if errors.Is(err, context.Canceled) {
					return c.CloseWrite()
				}
				return err
			})
			switch {
			case closed[x]:
				require.ErrorIs(t, err, ErrClosed, step)
			case finSent[x]:
				require.NoError(t, err, step) // idempotent
			case closed[1-x]:
				// A first one, or one resumed: it never half-closed,
				// or did without its FIN (Send says ErrClosed then).
				require.ErrorIs(t, err, ErrPeerGone, step)
				cwCalled[x] = resumed
			default:
				cwCalled[x] = true
				require.NoError(t, err, step)
				finSent[x] = true
			}
		default: // close, rarely
			if !nested && r.IntN(3) != 0 || nested && !finAtOnce(x) {
				return ""
			}
			step = fmt.Sprintf("step %d: side %d closes with %d unread, %d unread by it, send waiting %v, half-close waiting %v",
				i, x, unread(x), unread(1-x), sendWait[x] != nil, cwWait[x])
			closeSide(step, x)
		}
		return step
	}
	for i := range steps {
		if closed[0] && closed[1] {
			break
		}
		step := doStep(i, r.IntN(2), false)
		if step == "" {
			continue
		}
		check(step)
	}
	// The end: each side that is open reads what is left (which must all
	// be there, then io.EOF, where the peer closed), and closes.
	for _, x := range r.Perm(2) {
		c := conns[x]
		if closed[x] {
			continue
		}
		step := fmt.Sprintf("end: side %d reads %d left", x, unread(1-x))
		for closed[1-x] && !eof[x] {
			n, err := c.Recv(ctx, buf)
			if unread(1-x) == 0 {
				require.ErrorIs(t, err, io.EOF, "%s%s", step, state())
				eof[x] = true
				break
			}
			require.NoError(t, err, "%s%s", step, state())
			recvOK(step, x, n)
		}
		closeSide(fmt.Sprintf("end: side %d closes", x), x)
		check("end")
	}
	for x, c := range conns {
		require.Zero(t, c.Stats().Errors, "side %d counted an error: every end was graceful", x)
		require.ErrorIs(t, c.Send(ctx, []byte{1}), ErrClosed)
		_, err := c.Recv(ctx, buf)
		require.ErrorIs(t, err, ErrClosed)
		require.ErrorIs(t, c.CloseWrite(), ErrClosed)
		require.NoError(t, c.Close())
	}
	require.Equal(t, open, GlobalStats().ConnectionsOpen, "connections left open")
}
