package cm

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestEndParityRandom is TestEndParity with drawn scripts: each seed draws
// a few of the events the scenarios are made of (Sends of various sizes,
// Recvs, a Recv or a Send that waits and what ends it, CloseWrite, Close, a
// peer's death, a canceled or expiring context), on either end, runs the
// script on RC and on XRC (the scenarios' pairs) and compares what each
// gave: errors by the class errClass names, what was read, Stats.
//
// A normal run draws randParitySeeds seeds from 1; GOXRC_PARITY_SEEDS=N
// draws N, GOXRC_PARITY_SEED=S starts at S (alone, it runs seed S only).
func TestEndParityRandom(t *testing.T) {
	first, n := seedRange(t, "GOXRC_PARITY", randParitySeeds)
	for seed := first; seed < first+n; seed++ {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			script := drawParityScript(rand.New(rand.NewPCG(seed, 0)))
			got := map[string][]string{}
			for _, tr := range parityTransports {
				pair := tr.pair
				if tr.name == "XRC" && slices.ContainsFunc(script, func(st prStep) bool { return st.op == opStall }) {
					// The engine decides the stalled process's death
					// by its idle timeout: in about 3 s by default
					// (5 s), 0.5 s so (ten heartbeats).
					pair = func(t *testing.T) *parityPair {
						return xrcParityPairWith(t, func(c *config) {
							c.xrcHeartbeat, c.xrcIdle = 100*time.Millisecond, time.Second
						})
					}
				}
				ok := t.Run(tr.name, func(t *testing.T) {
					got[tr.name] = runParityScript(t, pair(t), script)
				})
				if !ok {
					t.Fatalf("seed %d failed on %s; its script (GOXRC_PARITY_SEED=%d):\n%s", seed, tr.name, seed, script)
				}
			}
			require.Equal(t, got["RC"], got["XRC"],
				"RC and XRC differ on seed %d; its script (GOXRC_PARITY_SEED=%d):\n%s", seed, seed, script)
		})
	}
}

// randParitySeeds is how many seeds a normal run draws: a few seconds, most
// of it the peer deaths (XRC takes about a second to decide one).
const randParitySeeds = 8

// prOp is a script's step.
type prOp uint8

const (
	opSend       prOp = iota // x sends a message of size
	opRecv                   // x receives (into a 16-byte buffer if short)
	opRecvAll                // x receives until a Recv fails
	opSendAll                // x sends until a Send fails
	opSettle                 // x's side takes in its peer's death (parityPair.settle)
	opCloseWrite             // x half-closes
	opClose                  // x closes
	opKill                   // x dies
	opStall                  // a's process stalls: it takes no message (answers no FIN)
	opStartRecv              // x's Recv starts, and waits
	opStartSend              // x's Send starts, and waits for credit
	opCancel                 // the waiting call's context is canceled
	opCollect                // the waiting call's outcome
	opFinal                  // x's calls (parityLog.calls) and Stats
)

// prCtx is the context of a step's call.
type prCtx uint8

const (
	ctxLive     prCtx = iota
	ctxCanceled       // canceled before the call
	ctxExpiring       // a deadline 10 ms on: only for a call that waits
)

// sizeMax and sizeTooLong stand for the sender's MaxMessageSize and one
// more (RC's and XRC's differ).
const (
	sizeMax     = -1
	sizeTooLong = -2
)

var prSizes = []int{0, 1, 16, 17, 64, 200, sizeMax, sizeTooLong}

// shortBuf is the buffer of a short Recv.
const shortBuf = 16

type prStep struct {
	op    prOp
	x     int // 0: a, 1: b
	size  int
	ctx   prCtx
	short bool
	// send: opCancel's and opCollect's call is x's waiting Send, not its
	// Recv.
	send bool
}

// prWait names a waiting call: x's Send or Recv.
type prWait struct {
	x    int
	send bool
}

type prScript []prStep

func (s prScript) String() string {
	var b strings.Builder
	for i, st := range s {
		fmt.Fprintf(&b, "\t%2d %s\n", i, st)
	}
	return b.String()
}

func (s prStep) String() string {
	n := [...]string{"a", "b"}[s.x]
	ctx := [...]string{"", " (canceled context)", " (10 ms deadline)"}[s.ctx]
	switch s.op {
	case opSend:
		return n + " sends " + prSizeName(s.size) + ctx
	case opRecv:
		if s.short {
			return n + " receives into 16 bytes" + ctx
		}
		return n + " receives" + ctx
	case opStartSend:
		return n + " sends " + prSizeName(s.size) + ", waiting for credit"
	case opCancel, opCollect:
		call := "Recv"
		if s.send {
			call = "Send"
		}
		return n + "'s waiting " + call + [...]string{opCancel: " is canceled", opCollect: " returns"}[s.op]
	}
	return n + [...]string{opRecvAll: " reads to the end", opSendAll: " sends until a Send fails",
		opSettle: " settles", opCloseWrite: " half-closes", opClose: " closes", opKill: " dies", opStall: " stalls",
		opStartRecv: " receives, waiting", opFinal: ": final calls"}[s.op]
}

func prSizeName(size int) string {
	switch size {
	case sizeMax:
		return "max"
	case sizeTooLong:
		return "max+1"
	}
	return strconv.Itoa(size)
}

// prModel is what the script's draw knows of each end, so as to draw only
// calls that return: no Recv with nothing to come, no Send beyond the
// window that no Recv frees, unless something in the script ends it.
type prModel struct {
	closed, wclosed, dead [2]bool
	// pending: the sizes of the messages x sent that its peer has not
	// read.
	pending [2][]int
	// read: how many of x's messages its peer has read.
	read [2]int
	// peerGone: x has taken in its peer's Close or death: a Send fails.
	peerGone [2]bool
}

// readOf is the peer's read of x's first pending message.
func (m *prModel) readOf(x int) {
	m.pending[x] = m.pending[x][1:]
	m.read[x]++
}

// canRecv reports whether x's Recv returns without waiting.
func (m *prModel) canRecv(x int) bool {
	y := 1 - x
	return m.closed[x] || len(m.pending[y]) > 0 || m.wclosed[y] || m.closed[y] || m.dead[y]
}

// canSend reports whether x's Send returns without waiting on the peer.
// The window is parityDepth messages, but on RC one credit of the messages
// read may stay with the reader (it returns them by half the depth, or at
// once to a sender its frames said was short), for a while: until it
// reads again, or its reaper takes the frame in which the sender said it
// was short (TestConnIdleReaderOwesNoCredit). After reads, a Send with
// parityDepth-1 messages unread may wait.
func (m *prModel) canSend(x int) bool {
	return m.closed[x] || m.wclosed[x] || m.peerGone[x] || len(m.pending[x]) < parityDepth-1
}

// sendOK reports whether x's Send of size succeeds.
func (m *prModel) sendOK(x, size int) bool {
	return !m.closed[x] && !m.wclosed[x] && !m.peerGone[x] && size != sizeTooLong
}

type prDraw struct {
	r *rand.Rand
	m prModel
	s prScript
}

func (d *prDraw) add(op prOp, x int) *prStep {
	d.s = append(d.s, prStep{op: op, x: x})
	return &d.s[len(d.s)-1]
}

func (d *prDraw) size() int { return prSizes[d.r.IntN(len(prSizes))] }

// sendable is a drawn size that a Send takes.
func (d *prDraw) sendable() int {
	if s := d.size(); s != sizeTooLong {
		return s
	}
	return sizeMax
}

// takeIn is y's taking in of its peer x's Close or death, as the scenarios
// do it: y reads to the end, sends until a Send fails where it still
// sends, and after a death settles.
func (d *prDraw) takeIn(y int, died bool) {
	x := 1 - y
	d.m.pending[x], d.m.pending[y] = nil, nil
	if d.m.dead[y] || d.m.closed[y] {
		return
	}
	d.m.peerGone[y] = true
	d.add(opRecvAll, y)
	if !d.m.wclosed[y] {
		d.add(opSendAll, y)
	}
	if died {
		d.add(opSettle, y)
	}
}

// close closes x; the calls waiting return, and then x's peer takes it
// in.
func (d *prDraw) close(x int, waiting ...prWait) {
	d.add(opClose, x)
	d.m.closed[x] = true
	d.collect(waiting...)
	d.takeIn(1-x, false)
}

// kill is close for x's death.
func (d *prDraw) kill(x int, waiting ...prWait) {
	d.add(opKill, x)
	d.m.dead[x] = true
	d.collect(waiting...)
	d.takeIn(1-x, true)
}

func (d *prDraw) collect(waiting ...prWait) {
	for _, w := range waiting {
		d.add(opCollect, w.x).send = w.send
	}
}

func (d *prDraw) cancel(w prWait) {
	d.add(opCancel, w.x).send = w.send
	d.collect(w)
}

// ender draws what ends x's waiting call (started by the caller; the
// deadline is drawn by the caller), adds it and the call's outcome, and
// reports false if what it drew does not suit the call (size: the
// waiting Send's).
func (d *prDraw) ender(x int, recv bool, size int) bool {
	y := 1 - x
	w := prWait{x, !recv}
	if d.r.IntN(2) == 0 {
		d.meanwhile(x, recv)
	}
	switch d.r.IntN(7) {
	case 0:
		d.cancel(w)
	case 1: // the peer's Send for a Recv, Recv for a Send
		if recv {
			if d.m.peerGone[y] {
				return false
			}
			d.add(opSend, y).size = d.sendable()
			d.m.read[y]++ // by the waiting Recv
		} else {
			d.add(opRecv, y)
			// One read, and the waiting Send's message goes.
			d.m.readOf(x)
			d.m.pending[x] = append(d.m.pending[x], size)
		}
		d.collect(w)
	case 2:
		if !recv {
			return false
		}
		d.add(opCloseWrite, y)
		d.m.wclosed[y] = true
		d.collect(w)
	case 3:
		d.close(y, w)
	case 4:
		d.kill(y, w)
	case 5:
		d.close(x, w)
	case 6: // its own end half-closes: that ends a Send
		if recv || d.m.wclosed[x] {
			return false
		}
		d.add(opCloseWrite, x)
		d.m.wclosed[x] = true
		d.collect(w)
	}
	return true
}

// twoWaits draws two calls that wait at once, both ends' Recvs or x's
// Send and Recv, and what ends them, or reports false if neither suits.
func (d *prDraw) twoWaits(x int) bool {
	y := 1 - x
	m := &d.m
	if m.canRecv(x) {
		return false
	}
	rx, ry, sx := prWait{x, false}, prWait{y, false}, prWait{x, true}
	if d.r.IntN(2) == 0 {
		if m.canRecv(y) {
			return false
		}
		d.add(opStartRecv, x)
		d.add(opStartRecv, y)
		switch d.r.IntN(4) {
		case 0:
			d.cancel(rx)
			d.cancel(ry)
		case 1:
			d.close(x, rx, ry)
		case 2:
			d.close(y, rx, ry)
		case 3: // each end's half-close ends the other's Recv
			d.add(opCloseWrite, x)
			m.wclosed[x] = true
			d.collect(ry)
			d.add(opCloseWrite, y)
			m.wclosed[y] = true
			d.collect(rx)
		}
		return true
	}
	if m.wclosed[x] || m.peerGone[x] || m.read[x] > 0 { // as a Send that waits
		return false
	}
	for len(m.pending[x]) < parityDepth {
		size := d.sendable()
		d.add(opSend, x).size = size
		m.pending[x] = append(m.pending[x], size)
	}
	d.add(opStartSend, x).size = d.sendable()
	d.add(opStartRecv, x)
	switch d.r.IntN(3) {
	case 0:
		d.close(x, sx, rx)
	case 1:
		d.close(y, sx, rx)
	case 2:
		d.kill(y, sx, rx)
	}
	return true
}

// meanwhile draws a step that leaves x's waiting call waiting, if one
// suits.
func (d *prDraw) meanwhile(x int, recv bool) {
	y := 1 - x
	m := &d.m
	switch d.r.IntN(3) {
	case 0: // x half-closes, under its waiting Recv
		if recv && !m.wclosed[x] {
			d.add(opCloseWrite, x)
			m.wclosed[x] = true
		}
	case 1: // the peer reads what x sent before, under x's waiting Recv
		if recv && len(m.pending[x]) > 0 {
			d.add(opRecv, y)
			m.readOf(x)
		}
	case 2: // the peer sends, under x's waiting Send, or half-closes
		if recv {
			break
		}
		if !m.wclosed[y] && !m.peerGone[y] && len(m.pending[y]) < parityDepth-1 {
			size := d.sendable()
			d.add(opSend, y).size = size
			m.pending[y] = append(m.pending[y], size)
		} else if !m.wclosed[y] {
			d.add(opCloseWrite, y)
			m.wclosed[y] = true
		}
	}
}

// drawParityScript draws a script of a few events, then closes every live
// end and makes the final calls on each.
func drawParityScript(r *rand.Rand) prScript {
	d := &prDraw{r: r}
	m := &d.m
	for events := 2 + r.IntN(6); events > 0; {
		x := r.IntN(2)
		y := 1 - x
		if m.dead[x] {
			continue
		}
		mark := len(d.s)
		saved := *m
		for i := range m.pending {
			saved.pending[i] = append([]int(nil), m.pending[i]...)
		}
		ok := true
		switch r.IntN(9) {
		case 0, 1: // Send
			size := d.size()
			if !m.canSend(x) {
				ok = false
				break
			}
			st := d.add(opSend, x)
			st.size = size
			if r.IntN(8) == 0 {
				st.ctx = ctxCanceled
			} else if m.sendOK(x, size) {
				m.pending[x] = append(m.pending[x], size)
			}
		case 2, 3: // Recv
			if !m.canRecv(x) {
				ok = false
				break
			}
			st := d.add(opRecv, x)
			st.short = r.IntN(4) == 0
			if r.IntN(8) == 0 {
				st.ctx = ctxCanceled
			} else if q := m.pending[y]; !m.closed[x] && len(q) > 0 {
				if !st.short || q[0] != sizeMax && q[0] <= shortBuf {
					m.readOf(y)
				}
			}
		case 4: // a Recv that waits
			if m.canRecv(x) {
				ok = false
				break
			}
			if r.IntN(6) == 0 {
				d.add(opRecv, x).ctx = ctxExpiring
				break
			}
			d.add(opStartRecv, x)
			ok = d.ender(x, true, 0)
		case 5: // a Send that waits for credit
			// Only while the window is whole: nothing of x's read
			// (see canSend).
			if m.closed[x] || m.wclosed[x] || m.peerGone[x] || m.dead[y] || m.closed[y] || m.read[x] > 0 {
				ok = false
				break
			}
			for len(m.pending[x]) < parityDepth {
				size := d.sendable()
				d.add(opSend, x).size = size
				m.pending[x] = append(m.pending[x], size)
			}
			size := d.sendable()
			if r.IntN(6) == 0 {
				st := d.add(opSend, x)
				st.size, st.ctx = size, ctxExpiring
				break
			}
			d.add(opStartSend, x).size = size
			ok = d.ender(x, false, size)
		case 6: // CloseWrite or Close
			if r.IntN(2) == 0 {
				// A CloseWrite again after one that returned nil
				// returns nil, whatever the peer did since (on RC it
				// said nil or ErrPeerGone by whether the Conn had
				// taken the peer's disconnect in, on XRC ErrPeerGone).
				d.add(opCloseWrite, x)
				if !m.closed[x] {
					m.wclosed[x] = true
				}
			} else if m.closed[x] {
				d.add(opClose, x) // again
			} else {
				d.close(x)
			}
		case 7: // death
			if m.dead[y] {
				ok = false
				break
			}
			if x == 0 && !m.closed[0] && !m.closed[1] && r.IntN(3) == 0 {
				// a stalls, b closes, and a dies before its FIN
				// (only a's process stalls: parityPair.stallA); b
				// takes the death in.
				d.add(opStall, 0)
				d.add(opClose, 1)
				d.add(opKill, 0)
				d.add(opSettle, 1)
				m.closed[1], m.dead[0] = true, true
				m.pending = [2][]int{}
				break
			}
			d.kill(x)
		case 8: // two calls wait at once
			ok = d.twoWaits(x)
		}
		if !ok {
			d.s, *m = d.s[:mark], saved
			continue
		}
		events--
	}
	for x := range 2 {
		if !m.dead[x] && !m.closed[x] {
			d.close(x)
		}
	}
	for x := range 2 {
		if !m.dead[x] {
			d.add(opFinal, x)
		}
	}
	return d.s
}

// prRun runs a script on a pair.
type prRun struct {
	t     *testing.T
	p     *parityPair
	l     parityLog
	seq   [2]int // messages made by each end, for their contents
	waits map[prWait]*prWaiting
}

// prWaiting is a call that waits: done has the logging of its outcome.
type prWaiting struct {
	done   chan func()
	cancel context.CancelFunc
}

func (r *prRun) conn(x int) *Conn  { return [...]*Conn{r.p.a, r.p.b}[x] }
func (r *prRun) name(x int) string { return [...]string{"a", "b"}[x] }

// msg is x's next message of size: its bytes name its number.
func (r *prRun) msg(x, size int) []byte {
	switch size {
	case sizeMax:
		size = r.conn(x).MaxMessageSize()
	case sizeTooLong:
		size = r.conn(x).MaxMessageSize() + 1
	}
	r.seq[x]++
	return bytes.Repeat([]byte{byte('A' + r.seq[x]%26)}, size)
}

func (r *prRun) ctx(c prCtx) (context.Context, context.CancelFunc) {
	switch c {
	case ctxCanceled:
		ctx, cancel := context.WithCancel(r.p.ctx)
		cancel()
		return ctx, cancel
	case ctxExpiring:
		return context.WithTimeout(r.p.ctx, 10*time.Millisecond)
	}
	return r.p.ctx, func() {}
}

// logRecv logs x's Recv: its error, or what it read (the peer's
// MaxMessageSize named so).
func (r *prRun) logRecv(what string, x int, b []byte, err error) {
	if err != nil {
		r.l.err(what, err)
		return
	}
	size := strconv.Itoa(len(b))
	if len(b) == r.conn(1-x).MaxMessageSize() {
		size = "max"
	}
	first := "-"
	if len(b) > 0 {
		first = string(b[:1])
	}
	r.l = append(r.l, fmt.Sprintf("%s: %s bytes of %s", what, size, first))
}

func (r *prRun) recv(ctx context.Context, x int, short bool) error {
	c := r.conn(x)
	buf := make([]byte, c.MaxRecvSize())
	if short {
		buf = buf[:shortBuf]
	}
	n, err := c.Recv(ctx, buf)
	r.logRecv(r.name(x)+".Recv", x, buf[:n], err)
	return err
}

// start runs call, w, which waits in fn, and returns once it does.
func (r *prRun) start(w prWait, fn string, call func(ctx context.Context) func()) {
	ctx, cancel := context.WithCancel(r.p.ctx)
	c := &prWaiting{done: make(chan func(), 1), cancel: cancel}
	go func() { c.done <- call(ctx) }()
	n := 1
	for o := range r.waits {
		if o.send == w.send {
			n++
		}
	}
	r.waits[w] = c
	waitParkedN(r.t, fn, n)
}

func (r *prRun) step(st prStep) {
	x, c, name := st.x, r.conn(st.x), r.name(st.x)
	ctx, cancel := r.ctx(st.ctx)
	defer cancel()
	switch st.op {
	case opSend:
		r.l.err(name+".Send", c.Send(ctx, r.msg(x, st.size)))
	case opRecv:
		r.recv(ctx, x, st.short)
	case opRecvAll:
		for r.recv(r.p.ctx, x, false) == nil {
		}
	case opSendAll:
		r.l.sendAll(r.p, name, c)
	case opSettle:
		[...]func(){r.p.settle, r.p.settleB}[x]()
	case opCloseWrite:
		r.l.err(name+".CloseWrite", c.CloseWrite())
	case opClose:
		r.l.err(name+".Close", c.Close())
	case opKill:
		[...]func(){r.p.killA, r.p.kill}[x]()
	case opStall:
		r.p.stallA()
	case opStartRecv:
		r.start(prWait{x, false}, "cm.(*Conn).Recv", func(ctx context.Context) func() {
			buf := make([]byte, c.MaxRecvSize())
			n, err := c.Recv(ctx, buf)
			return func() { r.logRecv(name+".Recv waiting", x, buf[:n], err) }
		})
	case opStartSend:
		msg := r.msg(x, st.size)
		r.start(prWait{x, true}, "cm.(*Conn).Send", func(ctx context.Context) func() {
			err := c.Send(ctx, msg)
			return func() { r.l.err(name+".Send waiting", err) }
		})
	case opCancel:
		r.waits[prWait{x, st.send}].cancel()
	case opCollect:
		w := r.waits[prWait{x, st.send}]
		delete(r.waits, prWait{x, st.send})
		(<-w.done)()
		w.cancel()
	case opFinal:
		r.l.calls(r.p, name, c)
		// And the net.Conn adapter's, over the closed connection.
		nc := c.NetConn()
		_, err := nc.Write([]byte("late"))
		r.l.err(name+".Write", err)
		_, err = nc.Read(make([]byte, 64))
		r.l.err(name+".Read", err)
		r.l = append(r.l, fmt.Sprintf("%s.MessagesReceived: %d", name, c.Stats().MessagesReceived))
	}
}

func runParityScript(t *testing.T, p *parityPair, s prScript) []string {
	r := &prRun{t: t, p: p, waits: map[prWait]*prWaiting{}}
	for _, st := range s {
		r.step(st)
	}
	return r.l
}

// seedRange is the seeds a randomized test draws: n from 1 in a normal
// run; PREFIX_SEEDS=N draws N, PREFIX_SEED=S starts at S (alone, it runs
// seed S only).
func seedRange(t *testing.T, prefix string, n uint64) (first, count uint64) {
	first, count = 1, n
	if v := os.Getenv(prefix + "_SEED"); v != "" {
		var err error
		first, err = strconv.ParseUint(v, 10, 64)
		require.NoError(t, err, prefix+"_SEED")
		count = 1
	}
	if v := os.Getenv(prefix + "_SEEDS"); v != "" {
		var err error
		count, err = strconv.ParseUint(v, 10, 64)
		require.NoError(t, err, prefix+"_SEEDS")
	}
	return first, count
}
