package cm

// A randomized stress test of one Conn pair over the fake transport: many
// goroutines send and receive (Send/SendWithImm, Recv/RecvWithImm, the
// NetConn adapter) with short random deadlines, one-sided operations run
// beside them, keepalive probes go out, and at random moments a side
// half-closes, closes (once, twice at once, or through its NetConn), its
// peer vanishes, a post or a poll fails, a frame header is corrupted, or a
// region is closed. Invariants: no panic or race; every message received
// was sent, intact, once, in order per sender, with no gap; a call that
// starts after Close (or a Send after CloseWrite) fails; nothing is left
// blocked after Close; Stats agree with what the calls returned.
//
// Seeds: CM_STRESS_SEEDS (how many, default 20), CM_STRESS_SEED (the first,
// default 1). A failing seed reruns alone with CM_STRESS_SEEDS=1
// CM_STRESS_SEED=<seed>. Odd seeds run with one more P than the default:
// goroutines are then preempted anywhere, as on a loaded machine (a waiter
// preempted between joining a round and its receive lost its wake-up: it
// showed only so).

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func stressEnv(name string, def uint64) uint64 {
	if s := os.Getenv(name); s != "" {
		if v, err := strconv.ParseUint(s, 10, 64); err == nil {
			return v
		}
	}
	return def
}

func TestConnStressRandomized(t *testing.T) {
	n := stressEnv("CM_STRESS_SEEDS", 20)
	first := stressEnv("CM_STRESS_SEED", 1)
	procs := runtime.GOMAXPROCS(0)
	defer runtime.GOMAXPROCS(procs)
	for s := first; s < first+n; s++ {
		runtime.GOMAXPROCS(procs + int(s%2))
		t.Run(fmt.Sprintf("seed=%d", s), func(t *testing.T) { runStress(t, s) })
	}
}

const stressHdr = 16

type stressSender struct {
	id   byte
	side int
	next atomic.Uint32 // seq of the next message; = messages whose Send succeeded
}

type stressState struct {
	t    *testing.T
	seed uint64

	senders map[byte]*stressSender

	mu    sync.Mutex
	recvd map[byte]map[uint32]bool
	fails []string

	okRecvs   [2]atomic.Uint64
	okSends   [2]atomic.Uint64
	closed    [2]atomic.Bool  // Close (or NetConn Close) returned
	closing   [2]atomic.Bool  // Close or CloseWrite called: a FIN may follow
	cwDone    [2]atomic.Bool  // CloseWrite returned nil
	faulted   atomic.Bool     // a fault was injected
	peerGone  [2]atomic.Value // a receiver's ErrPeerGone
	early     [2]atomic.Bool  // closed before the final Close
	slowClose []string
	sawEOF    [2]atomic.Bool
	stop      atomic.Bool
	lastErrs  sync.Map // kind -> count (for the log)
}

func (s *stressState) failf(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.fails) < 40 {
		s.fails = append(s.fails, fmt.Sprintf(format, args...))
	}
}

func (s *stressState) note(kind string) {
	v, _ := s.lastErrs.LoadOrStore(kind, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

func stressImm(id byte, seq uint32) uint32 { return uint32(id)<<24 ^ seq*2654435761 }

func stressMsg(seed uint64, id byte, seq uint32, n int, withImm bool) []byte {
	b := make([]byte, n)
	b[0] = 0xa5
	b[1] = id
	binary.BigEndian.PutUint32(b[2:], seq)
	binary.BigEndian.PutUint16(b[6:], uint16(n))
	if withImm {
		b[8] = 1
	}
	for j := stressHdr; j < n; j++ {
		b[j] = byte(seed) ^ id*31 ^ byte(seq*7) ^ byte(j)
	}
	binary.BigEndian.PutUint32(b[12:], crc32.ChecksumIEEE(b))
	return b
}

// check validates a received message; last is this receiver's last seq per
// sender.
func (s *stressState) check(side int, who string, b []byte, imm uint32, hasImm, immKnown bool, last map[byte]int64) {
	if len(b) < stressHdr || b[0] != 0xa5 {
		s.failf("%s: side %d received garbage of %d bytes: %x", who, side, len(b), b[:min(len(b), 16)])
		return
	}
	id := b[1]
	seq := binary.BigEndian.Uint32(b[2:])
	sum := binary.BigEndian.Uint32(b[12:])
	c := append([]byte(nil), b...)
	binary.BigEndian.PutUint32(c[12:], 0)
	if crc32.ChecksumIEEE(c) != sum || int(binary.BigEndian.Uint16(b[6:])) != len(b) {
		s.failf("%s: side %d: message %d/%d corrupt (len %d)", who, side, id, seq, len(b))
		return
	}
	snd := s.senders[id]
	if snd == nil || snd.side == side {
		s.failf("%s: side %d: message from unknown sender %d", who, side, id)
		return
	}
	if immKnown {
		want := b[8] == 1
		if hasImm != want || (want && imm != stressImm(id, seq)) {
			s.failf("%s: side %d: message %d/%d imm %v %#x, want %v %#x", who, side, id, seq, hasImm, imm, want, stressImm(id, seq))
		}
	}
	if l, ok := last[id]; ok && int64(seq) <= l {
		s.failf("%s: side %d: message %d/%d after %d: out of order", who, side, id, seq, l)
	}
	last[id] = int64(seq)
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.recvd[id]
	if m[seq] {
		s.failf("%s: side %d: message %d/%d duplicated", who, side, id, seq)
	}
	m[seq] = true
}

// allowedErr reports whether err is a result a call may give: the end of its
// context, the connection closed, failed, or the peer's protocol error.
func allowedErr(err error, ctx context.Context) bool {
	switch {
	case errors.Is(err, ErrClosed), errors.Is(err, ErrPeerGone), errors.Is(err, ErrProtocol):
		return true
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled), errors.Is(err, os.ErrDeadlineExceeded):
		return true
	}
	return false
}

func errKind(err error) string {
	switch {
	case err == nil:
		return "nil"
	case errors.Is(err, io.EOF):
		return "EOF"
	case errors.Is(err, ErrProtocol):
		return "protocol"
	case errors.Is(err, ErrPeerGone):
		return "peergone"
	case errors.Is(err, ErrClosed):
		return "closed"
	case errors.Is(err, ErrMessageTooLong):
		return "toolong"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
		return "deadline"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	return "other: " + err.Error()
}

func stressCtx(r *rand.Rand) (context.Context, context.CancelFunc) {
	switch x := r.IntN(10); {
	case x < 3:
		return context.WithCancel(context.Background()) // no deadline: only Close may end it
	case x < 6:
		return context.WithTimeout(context.Background(), time.Duration(20+r.IntN(500))*time.Microsecond)
	default:
		return context.WithTimeout(context.Background(), time.Duration(1+r.IntN(20))*time.Millisecond)
	}
}

func runStress(t *testing.T, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	depths := []int{2, 3, 4, 8, 16}
	sizes := []int{64, 256, 1024}
	o := fakeOpts{
		depth:   [2]int{depths[r.IntN(len(depths))], depths[r.IntN(len(depths))]},
		msgSize: [2]int{sizes[r.IntN(len(sizes))], sizes[r.IntN(len(sizes))]},
	}
	if r.IntN(3) > 0 {
		o.keepalive = time.Duration(200+r.IntN(3000)) * time.Microsecond
		o.holdProbes = r.IntN(2) == 0
	}
	switch r.IntN(3) {
	case 1:
		o.busyPoll = 50 * time.Microsecond
	case 2:
		o.busyPoll = 200 * time.Microsecond
	}
	a, b, w := fakePair(t, o)
	conns := [2]*Conn{a, b}
	s := &stressState{t: t, seed: seed, senders: map[byte]*stressSender{}, recvd: map[byte]map[uint32]bool{}}
	desc := fmt.Sprintf("seed %d opts %+v", seed, o)

	var ncs [2]net.Conn
	for i := range conns {
		if r.IntN(2) == 0 {
			ncs[i] = conns[i].NetConn()
		}
	}

	pauseEvery, pauseMs := 40, 5
	if os.Getenv("CM_STRESS_FOCUS") == "halfclose" {
		pauseEvery, pauseMs = 4, 20
	}
	var wg sync.WaitGroup
	var nextID byte = 1
	var running sync.Map // worker name -> struct{}
	spawn := func(name string, f func()) {
		wg.Add(1)
		running.Store(name, struct{}{})
		go func() {
			defer wg.Done()
			defer running.Delete(name)
			f()
		}()
	}

	for side := range conns {
		c := conns[side]
		nsend := 1 + r.IntN(3)
		for g := 0; g < nsend; g++ {
			snd := &stressSender{id: nextID, side: side}
			nextID++
			s.senders[snd.id] = snd
			s.recvd[snd.id] = map[uint32]bool{}
			mode := r.IntN(3) // 0 Send, 1 SendWithImm, 2 mixed (with NetConn if any)
			wr := rand.New(rand.NewPCG(seed, uint64(snd.id)))
			name := fmt.Sprintf("sender side=%d id=%d mode=%d", side, snd.id, mode)
			spawn(name, func() {
				for !s.stop.Load() {
					closedBefore := s.closed[side].Load()
					cwBefore := s.cwDone[side].Load()
					seq := snd.next.Load()
					n := stressHdr + wr.IntN(c.MaxMessageSize()-stressHdr+1)
					useImm := mode == 1 || (mode == 2 && wr.IntN(2) == 0)
					useNC := ncs[side] != nil && mode == 2 && wr.IntN(3) == 0
					if useNC {
						useImm = false
					}
					msg := stressMsg(seed, snd.id, seq, n, useImm)
					ctx, cancel := stressCtx(wr)
					var err error
					via := "send"
					if useNC {
						via = "netconn write"
						var k int
						k, err = ncs[side].Write(msg)
						if (err == nil) != (k == len(msg)) || (err != nil && k != 0) {
							s.failf("%s: Write returned %d, %v for %d bytes", name, k, err, len(msg))
						}
					} else if useImm {
						err = c.SendWithImm(ctx, msg, stressImm(snd.id, seq))
					} else {
						err = c.Send(ctx, msg)
					}
					ctxDone := ctx.Err() != nil
					cancel()
					s.note(via + " " + errKind(err))
					if err == nil {
						snd.next.Add(1)
						s.okSends[side].Add(1)
						if closedBefore || cwBefore {
							s.failf("%s: %s of %d/%d succeeded after Close=%v CloseWrite=%v returned", name, via, snd.id, seq, closedBefore, cwBefore)
						}
						continue
					}
					if !allowedErr(err, ctx) {
						s.failf("%s: %s: unexpected error %v", name, via, err)
					}
					if (closedBefore || cwBefore) && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded)) && !ctxDone && !useNC {
						s.failf("%s: %s after Close/CloseWrite gave a deadline error with the context live: %v", name, via, err)
					}
					if errors.Is(err, ErrClosed) || errors.Is(err, ErrPeerGone) || errors.Is(err, ErrProtocol) {
						time.Sleep(time.Duration(wr.IntN(200)) * time.Microsecond)
					}
				}
			})
		}
	}
	for side := range conns {
		c := conns[side]
		nrecv := 1 + r.IntN(2)
		if ncs[side] != nil {
			nrecv++ // the last one reads through the NetConn
		}
		for g := 0; g < nrecv; g++ {
			useNC := ncs[side] != nil && g == nrecv-1
			mode := r.IntN(3) // 0 Recv, 1 RecvWithImm, 2 mixed
			rr := rand.New(rand.NewPCG(seed, uint64(1000+side*100+g)))
			name := fmt.Sprintf("receiver side=%d g=%d mode=%d nc=%v", side, g, mode, useNC)
			spawn(name, func() {
				last := map[byte]int64{}
				sawEOF := false
				full := make([]byte, c.MaxRecvSize())
				for !s.stop.Load() {
					if rr.IntN(pauseEvery) == 0 {
						time.Sleep(time.Duration(1+rr.IntN(pauseMs)) * time.Millisecond) // let the peer run out of credit
					}
					closedBefore := s.closed[side].Load()
					ctx, cancel := stressCtx(rr)
					var (
						n       int
						imm     uint32
						hasImm  bool
						err     error
						known   bool
						via     = "recv"
						bufSize = len(full)
					)
					if useNC {
						via = "netconn read"
						n, err = ncs[side].Read(full)
					} else {
						if rr.IntN(10) == 0 {
							bufSize = rr.IntN(len(full) + 1)
						}
						if mode == 1 || (mode == 2 && rr.IntN(2) == 0) {
							n, imm, hasImm, err = c.RecvWithImm(ctx, full[:bufSize])
							known = true
						} else {
							n, err = c.Recv(ctx, full[:bufSize])
						}
					}
					ctxDone := ctx.Err() != nil
					cancel()
					s.note(via + " " + errKind(err))
					switch {
					case err == nil:
						s.okRecvs[side].Add(1)
						if closedBefore {
							s.failf("%s: %s returned a message after Close returned", name, via)
						}
						if sawEOF {
							s.failf("%s: %s returned a message after io.EOF", name, via)
						}
						s.check(side, name, full[:n], imm, hasImm, known, last)
					case errors.Is(err, io.EOF):
						if useNC && n != 0 {
							s.failf("%s: EOF with %d bytes", name, n)
						}
						sawEOF = true
						s.sawEOF[side].Store(true)
						if !s.closing[1-side].Load() {
							s.failf("%s: io.EOF though the peer never called Close or CloseWrite", name)
						}
						if closedBefore {
							s.failf("%s: %s returned io.EOF after Close returned (want ErrClosed)", name, via)
						}
						time.Sleep(time.Duration(rr.IntN(200)) * time.Microsecond)
					case errors.Is(err, ErrMessageTooLong):
						if bufSize == len(full) {
							s.failf("%s: ErrMessageTooLong with a full-size buffer: %v", name, err)
						}
					default:
						if !allowedErr(err, ctx) {
							s.failf("%s: %s: unexpected error %v", name, via, err)
						}
						if closedBefore && errors.Is(err, context.DeadlineExceeded) && !ctxDone && !useNC {
							s.failf("%s: %s after Close gave a deadline error with the context live: %v", name, via, err)
						}
						if errors.Is(err, ErrPeerGone) && !closedBefore {
							s.peerGone[side].Store(err.Error())
						}
						if errors.Is(err, ErrClosed) || errors.Is(err, ErrPeerGone) || errors.Is(err, ErrProtocol) {
							time.Sleep(time.Duration(rr.IntN(200)) * time.Microsecond)
						}
					}
				}
			})
		}
	}

	// One-sided operations: side i reads and writes exposed[1-i] from
	// local[i].
	var locals, exposed [2]*Region
	roExposed := [2]bool{}
	for side := range conns {
		if r.IntN(3) == 0 {
			continue
		}
		var err error
		locals[side], err = conns[side].RegisterMemory(4096, 0)
		if err != nil {
			t.Fatal(err)
		}
		roExposed[1-side] = r.IntN(16) == 0
		if roExposed[1-side] {
			s.faulted.Store(true)
		}
		access := RemoteRead | RemoteWrite
		if roExposed[1-side] {
			access = RemoteRead
		}
		exposed[1-side], err = conns[1-side].RegisterMemory(4096, access)
		if err != nil {
			t.Fatal(err)
		}
	}
	for side := range conns {
		if locals[side] == nil {
			continue
		}
		c, local, remote := conns[side], locals[side], exposed[1-side]
		desc := remote.Descriptor()
		or := rand.New(rand.NewPCG(seed, uint64(2000+side)))
		name := fmt.Sprintf("one-sided side=%d", side)
		spawn(name, func() {
			shadow := make([]byte, 4096)
			// A closed local region (fault 5) gives no memory, as a
			// device's deregistered one: the operation then fails on
			// the region, and what it would have written goes here.
			scratch := make([]byte, 4096)
			localBytes := func() []byte {
				if b := local.Bytes(); b != nil {
					return b
				}
				return scratch
			}
			dirty := false
			for iter := 0; !s.stop.Load(); iter++ {
				closedBefore := s.closed[side].Load()
				off, roff := or.IntN(4096), or.IntN(4096)
				n := or.IntN(min(4096-off, 4096-roff) + 1)
				var ctx context.Context
				var cancel context.CancelFunc
				if or.IntN(50) == 0 {
					ctx, cancel = context.WithTimeout(context.Background(), time.Duration(10+or.IntN(300))*time.Microsecond)
				} else {
					ctx, cancel = context.WithCancel(context.Background())
				}
				write := or.IntN(2) == 0
				var err error
				if write {
					lb := localBytes()
					for j := off; j < off+n; j++ {
						lb[j] = byte(iter) ^ byte(j)
					}
					err = c.WriteRemote(ctx, local, off, n, desc, uint64(roff))
					if err == nil {
						copy(shadow[roff:roff+n], lb[off:off+n])
					}
				} else {
					// The memory the read lands in, taken before: fault 5
					// may close the region once the read is done, and
					// Bytes then gives nothing (the check read scratch).
					lb := localBytes()
					err = c.ReadRemote(ctx, local, off, n, desc, uint64(roff))
					if err == nil && !dirty {
						if got := lb[off : off+n]; string(got) != string(shadow[roff:roff+n]) {
							s.failf("%s: read of %d bytes at %d differs from what was written", name, n, roff)
							dirty = true
						}
					}
				}
				cancel()
				s.note(fmt.Sprintf("rdma write=%v %s", write, errKind(err)))
				if err != nil {
					dirty = true
					if !errors.Is(err, ErrClosed) {
						s.faulted.Store(true)
					}
					if !allowedErr(err, ctx) && !strings.Contains(err.Error(), "local region") &&
						!strings.Contains(err.Error(), "remote access error") {
						s.failf("%s: unexpected error %v", name, err)
					}
					time.Sleep(time.Duration(or.IntN(200)) * time.Microsecond)
				} else if closedBefore {
					s.failf("%s: one-sided op succeeded after Close returned", name)
				}
			}
		})
	}

	// NetConn deadline shakers.
	for side := range ncs {
		nc := ncs[side]
		if nc == nil || r.IntN(2) == 0 {
			continue
		}
		dr := rand.New(rand.NewPCG(seed, uint64(3000+side)))
		spawn(fmt.Sprintf("deadlines side=%d", side), func() {
			for !s.stop.Load() {
				pick := func() time.Time {
					switch dr.IntN(4) {
					case 0:
						return time.Time{}
					case 1:
						return time.Now().Add(-time.Millisecond)
					default:
						return time.Now().Add(time.Duration(dr.IntN(2000)) * time.Microsecond)
					}
				}
				nc.SetReadDeadline(pick())
				nc.SetWriteDeadline(pick())
				time.Sleep(time.Duration(dr.IntN(1000)) * time.Microsecond)
			}
			nc.SetDeadline(time.Time{})
		})
	}

	// The schedule.
	closeErrs := [2]chan error{make(chan error, 4), make(chan error, 4)}
	var cwg sync.WaitGroup
	doClose := func(side int, how string) {
		s.closing[side].Store(true)
		var err error
		t0 := time.Now()
		wd := time.AfterFunc(flushWait, func() {
			if os.Getenv("CM_STRESS_DUMP") != "" {
				buf := make([]byte, 1<<22)
				n := runtime.Stack(buf, true)
				fmt.Fprintf(os.Stderr, "=== Close of side %d still running after %v:\n%s\n", side, flushWait, buf[:n])
			}
		})
		defer wd.Stop()
		defer func() {
			// With nothing faulted, Close waits for no bound: the
			// drain and the peer's answer come at once on the fake
			// wire. The shortest bound it could wait out is
			// flushWait (the handshake timeout is longer), so a
			// Close that took that long waited for something that
			// never came. A structural check, not a speed claim.
			if d := time.Since(t0); d >= flushWait {
				s.mu.Lock()
				s.slowClose = append(s.slowClose, fmt.Sprintf("Close (%s) of side %d took %v", how, side, d))
				s.mu.Unlock()
			}
		}()
		if how == "netconn" && ncs[side] != nil {
			err = ncs[side].Close()
		} else {
			err = conns[side].Close()
		}
		s.closed[side].Store(true)
		closeErrs[side] <- err
	}
	var events []string
	ev := func(f string, args ...any) { events = append(events, fmt.Sprintf(f, args...)) }
	step := int(stressEnv("CM_STRESS_STEP_US", 15000))
	sleep := func() { time.Sleep(time.Duration(r.IntN(step)) * time.Microsecond) }

	sleep()
	cwDone := make(chan string, 1)
	cwSide := -1
	// CM_STRESS_FOCUS=halfclose: always a background CloseWrite, then a
	// Close of the same side, no fault (the race of Close with a CloseWrite
	// waiting for credit).
	focus := os.Getenv("CM_STRESS_FOCUS") == "halfclose"
	if r.IntN(3) == 0 || focus {
		side := r.IntN(2)
		cwSide = side
		sleep()
		s.closing[side].Store(true)
		bg := r.IntN(2) == 0 || focus
		ev("CloseWrite side %d (background %v)", side, bg)
		cw := func() {
			err := conns[side].CloseWrite()
			if err == nil {
				s.cwDone[side].Store(true)
			} else if !allowedErr(err, nil) {
				s.failf("CloseWrite: %v", err)
			}
			cwDone <- fmt.Sprintf("CloseWrite side %d -> %v", side, err)
		}
		if bg {
			cwg.Add(1)
			go func() { defer cwg.Done(); cw() }()
		} else {
			cw()
		}
	}
	fault := r.IntN(12)
	if focus {
		fault = 11
	}
	faultSide := r.IntN(2)
	inject := func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		e := w.ends[faultSide]
		switch fault {
		case 0:
			ev("peer %d vanishes", faultSide)
			e.shut = true
		case 1:
			ev("side %d posts fail", faultSide)
			e.postFails = true
		case 2:
			ev("side %d poll fails", faultSide)
			e.pollErr = errors.New("fake: completion queue broken")
		case 3:
			ev("side %d corrupts a header", faultSide)
			e.corrupt = func(imm uint32) uint32 { return imm ^ 0x5 }
		case 4:
			if exposed[faultSide] != nil {
				ev("side %d closes its exposed region", faultSide)
				w.mu.Unlock()
				exposed[faultSide].Close()
				w.mu.Lock()
			}
		case 6:
			ev("side %d's device removed", faultSide)
			w.mu.Unlock()
			conns[faultSide].deviceRemoved()
			w.mu.Lock()
		case 7:
			ev("side %d's CM reports the peer disconnected", faultSide)
			w.mu.Unlock()
			conns[faultSide].peerGone("peer disconnected")
			w.mu.Lock()
		case 5:
			if locals[faultSide] != nil {
				ev("side %d closes its local region", faultSide)
				w.mu.Unlock()
				locals[faultSide].Close()
				w.mu.Lock()
			}
		default:
			return
		}
		s.faulted.Store(true)
	}
	closeFirst := r.IntN(2) == 0
	if !closeFirst {
		sleep()
		inject()
	}
	sleep()
	how := r.IntN(6)
	if focus {
		how = 1 + cwSide
	}
	switch how {
	case 0:
		ev("no early Close")
	case 1, 2:
		side := how - 1
		if cwSide >= 0 && (r.IntN(3) > 0 || focus) {
			side = cwSide
		}
		ev("Close side %d", side)
		s.early[side].Store(true)
		doClose(side, "conn")
	case 3:
		ev("Close both at once")
		cwg.Add(1)
		go func() { defer cwg.Done(); doClose(0, "conn") }()
		doClose(1, "conn")
	case 4:
		side := r.IntN(2)
		ev("double Close side %d", side)
		cwg.Add(1)
		go func() { defer cwg.Done(); doClose(side, "conn") }()
		doClose(side, "conn")
	case 5:
		side := r.IntN(2)
		ev("NetConn Close side %d (nc %v)", side, ncs[side] != nil)
		s.early[side].Store(true)
		doClose(side, "netconn")
	}
	if closeFirst {
		inject()
	}
	sleep()

	// A side closed alone, with nothing failing: the peer's receivers read
	// its end of stream, never ErrPeerGone.
	for side := range conns {
		if s.early[side].Load() && !s.early[1-side].Load() {
			time.Sleep(20 * time.Millisecond)
			if v := s.peerGone[1-side].Load(); v != nil && !s.faulted.Load() {
				s.failf("side %d closed gracefully (nothing failed), yet side %d's Recv got %v", side, 1-side, v)
			}
		}
	}

	// Calls after Close: each must fail.
	for side := range conns {
		if !s.closed[side].Load() {
			continue
		}
		c := conns[side]
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		if err := c.Send(ctx, stressMsg(seed, 0, 0, stressHdr, false)); err == nil || !(errors.Is(err, ErrClosed) || errors.Is(err, ErrPeerGone) || errors.Is(err, ErrProtocol)) {
			s.failf("Send after Close on side %d: %v", side, err)
		}
		if _, err := c.Recv(ctx, make([]byte, c.MaxRecvSize())); err == nil || !(errors.Is(err, ErrClosed) || errors.Is(err, ErrPeerGone) || errors.Is(err, ErrProtocol)) {
			s.failf("Recv after Close on side %d: %v", side, err)
		}
		if err := c.CloseWrite(); err == nil {
			s.failf("CloseWrite after Close on side %d: nil", side)
		}
		if reg, err := c.RegisterMemory(64, 0); err == nil {
			s.failf("RegisterMemory after Close on side %d succeeded", side)
			reg.Close()
		}
		cancel()
	}

	// The end: close both (again), stop the workers, and wait for them.
	select {
	case e := <-cwDone:
		ev("%s", e)
	default:
	}
	ev("final Close both")
	for side := range conns {
		cwg.Add(1)
		go func() { defer cwg.Done(); doClose(side, "conn") }()
	}
	closeDone := make(chan struct{})
	go func() { cwg.Wait(); close(closeDone) }()
	select {
	case <-closeDone:
	case <-time.After(10 * time.Second):
		s.failf("final Close did not return in 10 s")
		dumpStress(t)
	}
	s.stop.Store(true)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		var names []string
		running.Range(func(k, _ any) bool { names = append(names, k.(string)); return true })
		dumpStress(t)
		t.Fatalf("workers still blocked 5 s after Close returned: %v", names)
	}
	for _, rg := range append(locals[:], exposed[:]...) {
		if rg != nil {
			rg.Close()
		}
	}

	// Invariants over the whole run.
	for side := range conns {
		st := conns[side].Stats()
		if st.MessagesSent != s.okSends[side].Load() {
			s.failf("side %d: Stats.MessagesSent %d, successful sends %d", side, st.MessagesSent, s.okSends[side].Load())
		}
		if st.MessagesReceived != s.okRecvs[side].Load() {
			s.failf("side %d: Stats.MessagesReceived %d, successful receives %d", side, st.MessagesReceived, s.okRecvs[side].Load())
		}
		if st.MessagesReceived > conns[1-side].Stats().MessagesSent {
			s.failf("side %d received %d messages, the peer sent %d", side, st.MessagesReceived, conns[1-side].Stats().MessagesSent)
		}
		if st.Errors > 1 {
			s.failf("side %d: Stats.Errors %d", side, st.Errors)
		}
		if st.Errors != 0 && !s.faulted.Load() {
			conns[side].mu.Lock()
			cerr := conns[side].err
			conns[side].mu.Unlock()
			// A post (or probe) to a peer whose QP the fake has shut
			// fails when the fake's retries run out (fakeRetryTime) if
			// the peer's CM has not reported the disconnect by then (the
			// Conn shuts its QP in release's fail, before the
			// transport's release tells the peer; under load that gap
			// may outlast the retries, as a device's could): not the
			// Conn's doing.
			artifact := !strings.Contains(cerr.Error(), "peer disconnected") &&
				(errors.Is(cerr, errFakeFlushed) || strings.Contains(cerr.Error(), "fake: transport retries exceeded"))
			if !artifact {
				s.failf("side %d: Stats.Errors %d with nothing failed (err %v)", side, st.Errors, cerr)
			}
		}
	}
	for id, snd := range s.senders {
		got := s.recvd[id]
		sent := snd.next.Load()
		for q := range got {
			if q >= sent {
				s.failf("sender %d: seq %d received, only %d sent", id, q, sent)
			}
		}
		k := uint32(len(got))
		for q := uint32(0); q < k; q++ {
			if !got[q] {
				s.failf("sender %d (side %d): received %d messages but seq %d missing (a gap: lost)", id, snd.side, k, q)
				break
			}
		}
	}
	// A side that read io.EOF read everything the peer sent, unless it was
	// closed itself (a Recv may lose its message to Close) or something
	// failed.
	for side := range conns {
		if !s.sawEOF[side].Load() || s.faulted.Load() {
			continue
		}
		for id, snd := range s.senders {
			if snd.side == 1-side && uint32(len(s.recvd[id])) != snd.next.Load() {
				s.failf("side %d read io.EOF but has %d of sender %d's %d messages", side, len(s.recvd[id]), id, snd.next.Load())
			}
		}
	}
	close(closeErrs[0])
	close(closeErrs[1])
	for side := range closeErrs {
		var first error
		n := 0
		for err := range closeErrs[side] {
			if n == 0 {
				first = err
			} else if (first == nil) != (err == nil) {
				s.failf("side %d: Close returned %v, then %v", side, first, err)
			}
			n++
		}
	}

	if !s.faulted.Load() && len(s.slowClose) > 0 {
		s.failf("with nothing failed: %v", s.slowClose)
	}

	// Nothing of the pair may be left running.
	deadline := time.Now().Add(3 * time.Second)
	for {
		left := stressLeftovers()
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			s.failf("goroutines left after Close:\n%s", strings.Join(left, "\n\n"))
			break
		}
		time.Sleep(5 * time.Millisecond)
	}

	if len(s.fails) > 0 || os.Getenv("CM_STRESS_V") != "" {
		var kinds []string
		s.lastErrs.Range(func(k, v any) bool {
			kinds = append(kinds, fmt.Sprintf("%s=%d", k, v.(*atomic.Int64).Load()))
			return true
		})
		report := t.Errorf
		if len(s.fails) == 0 {
			report = t.Logf
		}
		report("%s\nevents: %s\nresults: %s\nstats a %+v b %+v\nfailures:\n  %s", desc, strings.Join(events, "; "),
			strings.Join(kinds, " "), a.Stats(), b.Stats(), strings.Join(s.fails, "\n  "))
	}
}

func dumpStress(t *testing.T) {
	buf := make([]byte, 1<<22)
	n := runtime.Stack(buf, true)
	t.Logf("goroutines:\n%s", buf[:n])
}

// stressLeftovers lists goroutines still in the Conn's code (keepalive
// loops, persist timers, background releases, blocked calls).
func stressLeftovers() []string {
	buf := make([]byte, 1<<22)
	n := runtime.Stack(buf, true)
	var left []string
	for _, g := range strings.Split(string(buf[:n]), "\n\n") {
		// The main goroutine runs the tests from TestMain.
		if strings.Contains(g, "cm.stressLeftovers") || strings.Contains(g, "cm.TestMain(") || strings.Contains(g, "testing.tRunner") && strings.Contains(g, "cm.runStress") && !strings.Contains(g, "runStress.func") {
			continue
		}
		if strings.Contains(g, "goxrc/cm.") && !strings.Contains(g, "cm.TestConnStressRandomized") {
			left = append(left, g)
		}
	}
	return left
}
