package xrc

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/verbs"
	"github.com/goxrc/goxrc/xrc/internal/wire"
)

// FuzzFrameDispatch feeds a receiving leg whatever frames a peer holding it
// may send (any kind byte, any length, any sequence numbers, FINs with any
// tags, credit frames with any body), through consumeLocked as the receive
// loop does once tag and TGT are checked. Whatever comes: no panic; a frame
// is kept (queued for Recv) only if it is a well-formed data frame, not
// after the peer's FIN, and with a number never kept before; the queue never
// passes maxQueued; the only way the connection fails is ErrProtocol (an
// overrun, or a number past the replay window: a data frame) or, for a
// first frame that is the peer's full FIN, errAbandoned; only a FIN with
// our tags counts as the peer's; a credit frame never moves acked past sent
// (0 here); a keepalive with a body is dropped (counted).
func FuzzFrameDispatch(f *testing.F) {
	const tag, peerTag = 0x2222, 0x1111
	fin := func(t, st uint32, half bool) []byte {
		b := make([]byte, 1+wire.FinLen)
		b[0] = kindFIN
		(&wire.FIN{Tag: t, SenderTag: st, Half: half}).Encode(b[1:])
		return b
	}
	join := func(frames ...[]byte) []byte {
		var out []byte
		for _, fr := range frames {
			out = append(out, byte(len(fr)))
			out = append(out, fr...)
		}
		return out
	}
	data := func(seq uint32, msg string) []byte {
		b := []byte{kindData, 0, 0, 0, 0}
		binary.BigEndian.PutUint32(b[1:], seq)
		return append(b, msg...)
	}
	f.Add(join(data(0, "a"), data(1, "b"), data(1, "b"), []byte("H"), []byte{kindCredit, 0, 0, 0, 9}), uint8(2), false)
	f.Add(join(data(0, ""), fin(tag, peerTag, true), data(1, "late")), uint8(1), false)
	f.Add(join(fin(tag, peerTag, false), data(0, "x")), uint8(1), true)
	f.Add(join(fin(tag, peerTag+1, false), data(0, "x"), []byte("Z")), uint8(3), true)
	f.Add(join(fin(tag, peerTag, true), data(0, "x")), uint8(1), true) // a half FIN abandons nothing
	f.Add(join(data(0x7fffffff, "far"), data(0, "old"), data(5, "x"), data(6, "y"), data(7, "z")), uint8(1), false)
	f.Add(join([]byte("Hjunk"), data(0, "a")), uint8(1), false)
	f.Add(join([]byte{kindData, 0, 0}, data(0, "a")), uint8(1), false) // too short for its number
	f.Fuzz(func(t *testing.T, frames []byte, window uint8, awaitFirst bool) {
		e := &Endpoint{cfg: Config{RecvWindow: int(window%8) + 1}, conns: map[*Conn]struct{}{}, pending: map[uint32]*Conn{},
			recv: map[uint32]*Conn{}, acc: newAcceptor(acceptorConfig{})}
		leg := &acceptedLeg{PeerIncarnation: 1, PeerTag: peerTag, Tag: tag, Downlink: &downlink{}}
		e.mu.Lock()
		defer e.mu.Unlock()
		c := e.newConnLocked(netip.MustParseAddrPort("10.0.0.1:1"))
		c.recvLeg, c.recvTag, c.recvUp, c.awaitFirst, c.inbound = leg, tag, true, awaitFirst, awaitFirst
		e.recv[tag] = c
		kept := map[uint32]bool{}
		for len(frames) > 0 {
			n := int(frames[0])
			frames = frames[1:]
			if n > len(frames) {
				n = len(frames)
			}
			p := append([]byte(nil), frames[:n]...)
			frames = frames[n:]
			if len(p) == 0 || e.recv[tag] != c {
				continue // deliver drops empty messages, and any for a tag no longer registered
			}
			finBefore, errBefore, first := c.finRcvd, c.err, c.awaitFirst
			qBefore, droppedBefore := c.q.Len(), e.dropped.Load()
			k := e.consumeLocked(c, leg, p)
			if p[0] == kindHeartbeat && len(p) > 1 && errBefore == nil && e.dropped.Load() == droppedBefore {
				t.Fatalf("a keepalive with a %d-byte body was taken", len(p)-1)
			}
			if k {
				if p[0] != kindData || len(p) < 1+dataSeqLen {
					t.Fatalf("kept a frame that is no data frame: %x", p)
				}
				if finBefore || errBefore != nil {
					t.Fatalf("kept data after FIN (%v) or failure (%v)", finBefore, errBefore)
				}
				seq := binary.BigEndian.Uint32(p[1:])
				if kept[seq] {
					t.Fatalf("data number %d kept twice", seq)
				}
				kept[seq] = true
				if c.q.Len() != qBefore+1 {
					t.Fatalf("kept but queue %d -> %d", qBefore, c.q.Len())
				}
			} else if c.q.Len() != qBefore {
				t.Fatalf("not kept but queue %d -> %d", qBefore, c.q.Len())
			}
			if c.q.Len() > maxQueued(e.cfg.RecvWindow) {
				t.Fatalf("queue %d over %d", c.q.Len(), maxQueued(e.cfg.RecvWindow))
			}
			if c.err != nil && !errors.Is(c.err, ErrProtocol) && !errors.Is(c.err, errAbandoned) {
				t.Fatalf("failed with %v", c.err)
			}
			var fr wire.FIN
			ours := p[0] == kindFIN && wire.DecodeFIN(p[1:], &fr) == nil && fr.Tag == tag && fr.SenderTag == peerTag
			if errBefore == nil && c.err != nil && (errors.Is(c.err, errAbandoned) && !(first && ours && !fr.Half) ||
				errors.Is(c.err, ErrProtocol) && p[0] != kindData) {
				t.Fatalf("frame %x (first %v) failed the connection with %v", p, first, c.err)
			}
			if !finBefore && c.finRcvd && !ours {
				t.Fatalf("frame %x taken for the peer's FIN", p)
			}
			if c.acked != 0 {
				t.Fatalf("acked %d with nothing sent", c.acked)
			}
		}
	})
}

// deliverModel is what Endpoint.deliver should do with a message, written
// from docs/xrc-protocol.md ("Data path", "Flow control"), the slow way: a
// message is taken only if its receive succeeded, it has a payload, and its
// tag names a live leg and it came through that leg's TGT, or through the
// TGT the leg moved away from until the SRQ next drains and while no other
// sender's TGT holds that number; or its tag is a reverse leg announced and
// not registered yet, kept up to twice the window. Everything else is
// counted in Stats.Dropped, and so is a taken frame that is malformed, data
// after the peer's FIN, a credit frame whose body is not 4 bytes, a
// keepalive with a body, a FIN naming other tags. A data number seen before
// (or older than the window) counts as a duplicate; one a span or more
// ahead, or one that finds the queue at twice the window, fails the
// connection as an overrun (ErrProtocol), which ends its receiving leg: what
// comes later for its tag is dropped. A full FIN ends the leg too.
type deliverModel struct {
	window                  int
	registered, fin, failed bool
	drained, otherHoldsOld  bool
	q, early                [][]byte
	earlyTGT                []uint32
	seen                    *replayModel
	dropped, dups, overruns uint64
	consumed                bool // the last message reached the leg: a sign of life
	kept                    bool
}

func (m *deliverModel) deliver(imm, tgt uint32, ok bool, p []byte, tag, early, legTGT, oldTGT, peerTag uint32) {
	m.kept, m.consumed = false, false
	switch {
	case !ok || len(p) == 0:
		m.dropped++
	case imm == early:
		if len(m.early) < 2*m.window {
			m.early, m.earlyTGT, m.kept = append(m.early, p), append(m.earlyTGT, tgt), true
		} else {
			m.dropped++
		}
	case imm == tag && m.registered && (tgt == legTGT || tgt == oldTGT && !m.drained && !m.otherHoldsOld):
		m.consumed = true
		m.consume(p, tag, peerTag)
	default:
		m.dropped++
	}
}

func (m *deliverModel) consume(p []byte, tag, peerTag uint32) {
	body := p[1:]
	switch p[0] {
	case 'D':
		if len(body) < 4 || m.fin {
			m.dropped++
			return
		}
		s := binary.BigEndian.Uint32(body)
		if d := s - m.seen.next; int32(d) >= 0 && d >= m.seen.size {
			m.overruns++
			m.fail()
			return
		}
		if !m.seen.take(s) {
			m.dups++
			return
		}
		if len(m.q) == 2*m.window {
			m.overruns++
			m.fail()
			return
		}
		m.q, m.kept = append(m.q, p), true
	case 'C':
		if len(body) != 4 {
			m.dropped++
		}
	case 'H':
		if len(body) != 0 {
			m.dropped++
		}
	case 'F':
		var f wire.FIN
		if wire.DecodeFIN(body, &f) != nil || f.Tag != tag || f.SenderTag != peerTag {
			m.dropped++
			return
		}
		m.fin = true
		if !f.Half {
			m.registered = false
		}
	default:
		m.dropped++
	}
}

func (m *deliverModel) fail() { m.failed, m.registered = true, false }

// FuzzDeliver drives the receive loop's whole dispatch (Endpoint.deliver):
// each message has a tag (the leg's, an unknown one, or the reserved tag
// of a reverse leg not registered yet), a TGT (the leg's, a number it moved
// away from, another sender's, 0), a status and a payload; between messages
// the SRQ may drain (the moved-from TGT is then refused) and another
// sender's TGT may take the moved-from number. Whatever comes, deliver does
// what deliverModel does: the same messages kept, in the queue in the same
// order, the same counted as dropped, duplicates and overruns (exactly, so
// nothing is dropped uncounted or counted twice), the connection failed and
// ended and FIN'd alike; only a message that reached the leg counts as a
// sign of life (lastSeen); and credit frames never move acked (nothing was
// sent).
func FuzzDeliver(f *testing.F) {
	const tag, peerTag, early = 0x2222, 0x1111, 0x3333
	const tgt, oldTGT, otherTGT = 0x50, 0x40, 0x60
	fin := func(half bool) []byte {
		b := make([]byte, 1+wire.FinLen)
		b[0] = kindFIN
		(&wire.FIN{Tag: tag, SenderTag: peerTag, Half: half}).Encode(b[1:])
		return b
	}
	f.Add([]byte{0, 6, 'D', 0, 0, 0, 0, 'x', 0x11, 1, 'H', 0x20, 1, 'H', 0x04, 6, 'D', 0, 0, 0, 1, 'y'}, uint8(1))
	f.Add([]byte{0x12, 6, 'D', 0, 0, 0, 0, 'x', 0x02, 0, 0x40, 3, 'C', 0, 0}, uint8(4))
	f.Add([]byte{0x04, 5, 'D', 0, 0, 0, 0, 0x84, 5, 'D', 0, 0, 0, 1, 0x24, 5, 'D', 0, 0, 0, 2, 0x00, 5, 'D', 0, 0, 0, 3}, uint8(2))
	msg := func(sel byte, p []byte) []byte { return append([]byte{sel, byte(len(p))}, p...) }
	f.Add(slices.Concat(msg(0, fin(true)), msg(0, []byte{'D', 0, 0, 0, 0}), msg(0, []byte{'C', 0, 0, 0, 1}), msg(0, fin(false)), msg(0, []byte{'H'})), uint8(1))
	f.Add([]byte{0, 5, 'D', 0, 0, 0, 0x40, 0, 5, 'D', 0, 0, 0, 0, 0, 5, 'D', 0, 0, 0, 1, 0, 5, 'D', 0, 0, 0, 2, 0, 1, 'H'}, uint8(0))
	// Window 1: the third number in a row finds the queue full.
	f.Add(slices.Concat(msg(0, []byte{'D', 0, 0, 0, 0}), msg(0, []byte{'H', 'x'}), msg(0, []byte{'D', 0, 0, 0, 1}), msg(0, []byte{'D', 0, 0, 0, 2}), msg(0, []byte{'D', 0, 0, 0, 3})), uint8(0))
	// A data frame too short for its number, then a whole one.
	f.Add(slices.Concat(msg(0, []byte{'D', 0, 0}), msg(0, []byte{'D', 0, 0, 0, 0, 'x'})), uint8(1))
	f.Fuzz(func(t *testing.T, msgs []byte, window uint8) {
		drains := uint64(0)
		e := &Endpoint{cfg: Config{RecvWindow: int(window%8) + 1}, conns: map[*Conn]struct{}{}, pending: map[uint32]*Conn{},
			recv: map[uint32]*Conn{}, acc: newAcceptor(acceptorConfig{Drains: func() uint64 { return drains }})}
		dl := &downlink{TGTQPN: tgt, count: 2} // 2: a release never reaches the (absent) kernel
		leg := &acceptedLeg{PeerIncarnation: 1, PeerTag: peerTag, Tag: tag, Downlink: dl, prev: []prevTGT{{num: oldTGT, dl: &downlink{TGTQPN: oldTGT, count: 1, prevs: 1}}}}
		e.acc.legs[legKey{1, peerTag}] = leg
		e.acc.byTGT[tgt] = dl
		e.mu.Lock()
		c := e.newConnLocked(netip.MustParseAddrPort("10.0.0.1:1"))
		c.recvLeg, c.recvTag, c.recvUp = leg, tag, true
		e.recv[tag] = c
		// A second connection, a dial whose reverse leg is announced.
		d := e.newConnLocked(netip.MustParseAddrPort("10.0.0.2:1"))
		d.earlyTag = early
		e.recv[early] = d
		e.mu.Unlock()
		span := uint32(64) // "twice its receive window rounded up to a power of two, at least 64"
		for span < uint32(2*e.cfg.RecvWindow) {
			span *= 2
		}
		m := &deliverModel{window: e.cfg.RecvWindow, registered: true, seen: newReplayModel(span, 0)}
		other := &downlink{TGTQPN: oldTGT, Incarnation: 2, count: 1}
		past := time.Unix(1, 0)
		for len(msgs) >= 2 {
			sel, n := msgs[0], int(msgs[1])
			msgs = msgs[2:]
			n = min(n, len(msgs))
			p := append([]byte(nil), msgs[:n]...)
			msgs = msgs[n:]
			if sel&0x80 != 0 { // the receive loop emptied the SRQ
				drains++
				m.drained = true
			}
			if sel&0x20 != 0 && !m.otherHoldsOld { // another sender's TGT got the number left
				e.acc.byTGT[oldTGT] = other
				m.otherHoldsOld = true
			}
			wc := kernel.RecvCompletion{Imm: []uint32{tag, early, 0x9999, 0}[sel&3], TGTQPN: []uint32{tgt, oldTGT, otherTGT, 0}[sel>>2&3], Payload: p}
			if sel&0x40 != 0 {
				wc.Status = verbs.WCLocLenErr
			}
			e.mu.Lock()
			c.lastSeen = past
			e.mu.Unlock()
			kept := e.deliver(&wc)
			m.deliver(wc.Imm, wc.TGTQPN, wc.Status == verbs.WCSuccess, p, tag, early, tgt, oldTGT, peerTag)

			e.mu.Lock()
			where := func() string {
				return fmt.Sprintf("message %x (tag %#x, TGT %#x, status %v, drained %v, old number taken %v)",
					p, wc.Imm, wc.TGTQPN, wc.Status, m.drained, m.otherHoldsOld)
			}
			if kept != m.kept {
				t.Fatalf("%s: kept %v, the model %v", where(), kept, m.kept)
			}
			if got := [3]uint64{e.dropped.Load(), e.duplicates.Load(), e.overruns.Load()}; got != [3]uint64{m.dropped, m.dups, m.overruns} {
				t.Fatalf("%s: dropped, duplicates, overruns %v, the model %v", where(), got, [3]uint64{m.dropped, m.dups, m.overruns})
			}
			if c.q.Len() != len(m.q) {
				t.Fatalf("%s: queue of %d, the model %d", where(), c.q.Len(), len(m.q))
			}
			for i := range m.q {
				if !bytes.Equal(*c.q.At(i), m.q[i]) {
					t.Fatalf("%s: queued #%d %x, the model %x", where(), i, *c.q.At(i), m.q[i])
				}
			}
			if len(d.early) != len(m.early) {
				t.Fatalf("%s: %d early, the model %d", where(), len(d.early), len(m.early))
			}
			for i, x := range d.early {
				if x.tgt != m.earlyTGT[i] || !bytes.Equal(x.payload, m.early[i]) {
					t.Fatalf("%s: early #%d %#x %x, the model %#x %x", where(), i, x.tgt, x.payload, m.earlyTGT[i], m.early[i])
				}
			}
			if (c.err != nil) != m.failed || (c.err != nil && !errors.Is(c.err, ErrProtocol)) {
				t.Fatalf("%s: connection error %v, the model failed %v", where(), c.err, m.failed)
			}
			if c.finRcvd != m.fin || (e.recv[tag] == c) != m.registered {
				t.Fatalf("%s: FIN %v, registered %v; the model %v, %v", where(), c.finRcvd, e.recv[tag] == c, m.fin, m.registered)
			}
			if seen := !c.lastSeen.Equal(past); seen != m.consumed {
				t.Fatalf("%s: counted as a sign of life %v, the model %v", where(), seen, m.consumed)
			}
			if c.acked != 0 || d.err != nil {
				t.Fatalf("%s: acked %d with nothing sent; announced dial's error %v", where(), c.acked, d.err)
			}
			e.mu.Unlock()
		}
	})
}

// FuzzEarlyReplay: a dial's acceptor may send on the reverse leg its ACCEPT
// announces (FlagOneExchange) before the dialer has read that ACCEPT;
// deliver keeps those messages (bounded) and takeReverse, once it has
// verified and registered the leg, replays them. Whatever the acceptor sent
// before and after (any frames, through the leg's TGT or another), the
// replay and the messages that follow it do what deliverModel does with
// the same messages delivered once the leg is registered: the same kept,
// queued in the same order, the same counted as dropped, duplicates and
// overruns, the connection failed (only with ErrProtocol) and FIN'd alike,
// the leg still registered alike; and credit frames never move acked
// (nothing was sent).
func FuzzEarlyReplay(f *testing.F) {
	const peerTag = 0x5EED
	fin := func(half bool) []byte {
		b := make([]byte, 1+wire.FinLen)
		b[0] = kindFIN
		(&wire.FIN{Tag: 1, SenderTag: peerTag, Half: half}).Encode(b[1:]) // sel&2 names the leg's tag
		return b
	}
	// msgs: (sel, len, payload)*; sel&1 picks another TGT than the leg's,
	// sel&2 writes the leg's tag (reserved at run time) where a FIN has
	// its Tag. The first split messages come before takeReverse, the rest
	// after.
	msg := func(sel byte, p []byte) []byte { return append([]byte{sel, byte(len(p))}, p...) }
	f.Add(slices.Concat(msg(0, []byte{'D', 0, 0, 0, 0, 'x'}), msg(0, []byte{'D', 0, 0, 0, 1}), msg(0, []byte{'D', 0, 0, 0, 1})), uint8(1), uint8(2))
	f.Add(slices.Concat(msg(1, []byte{'D', 0, 0, 0, 0}), msg(0, []byte{'H'}), msg(0, []byte{'C', 0, 0, 0, 9}), msg(0, []byte{'D', 0, 0, 0, 0})), uint8(0), uint8(3))
	f.Add(slices.Concat(msg(0, []byte{'D', 0, 0, 0, 0}), msg(0, []byte{'D', 0, 0, 0, 1}), msg(0, []byte{'D', 0, 0, 0, 2}), msg(0, []byte{'D', 0, 0, 0, 3}), msg(0, []byte{'D', 0, 0, 0, 4})), uint8(0), uint8(5))
	f.Add(slices.Concat(msg(0, []byte{'D', 0, 0, 0, 0x40}), msg(0, []byte{'D', 0, 0, 0, 0})), uint8(2), uint8(1))
	f.Add(slices.Concat(msg(0, []byte{'D', 0, 0, 0, 0}), msg(0, []byte{}), msg(0, []byte{'H', 'x'})), uint8(3), uint8(9))
	f.Add(slices.Concat(msg(0, []byte{'D', 0, 0, 0, 0}), msg(2, fin(true)), msg(0, []byte{'D', 0, 0, 0, 1})), uint8(1), uint8(2))
	f.Add(slices.Concat(msg(0, []byte{'D', 0, 0, 0, 0}), msg(2, fin(false)), msg(0, []byte{'D', 0, 0, 0, 1})), uint8(1), uint8(1))
	f.Add(slices.Concat(msg(2, fin(false)), msg(0, []byte{'D', 0, 0, 0, 0})), uint8(1), uint8(0))
	// Both before the registration: the replayed FIN ends the leg, and the
	// data after it finds its tag gone.
	f.Add(slices.Concat(msg(2, fin(false)), msg(0, []byte{'D', 0, 0, 0, 0})), uint8(1), uint8(2))
	f.Fuzz(func(t *testing.T, msgs []byte, window, split uint8) {
		env := newEnv(t)
		_, u := env.phys(env.r1, nil) // the acceptor's TGT in the dialer's node (r2's)
		r := env.r2
		e := &Endpoint{cfg: Config{RecvWindow: int(window%8) + 1}, conns: map[*Conn]struct{}{}, pending: map[uint32]*Conn{},
			recv: map[uint32]*Conn{}, acc: r.acc}
		tag := r.acc.ReserveTag()
		e.mu.Lock()
		c := e.newConnLocked(netip.AddrPortFrom(addrA, 30000))
		c.sendTag, c.earlyTag = 1, tag
		e.recv[tag] = c
		e.mu.Unlock()
		acc := &wire.Accept{Flags: wire.AcceptReverse, Incarnation: senderInc, SRQN: 0x99,
			Rev: wire.Reverse{Tag: peerTag, INIQPN: u.iniQPN, TGTQPN: u.tgtQPN, DomainID: env.dom.ID}}
		span := uint32(64)
		for span < uint32(2*e.cfg.RecvWindow) {
			span *= 2
		}
		const noTGT = ^uint32(0) // the leg moved from no TGT
		m := &deliverModel{window: e.cfg.RecvWindow, registered: true, seen: newReplayModel(span, 0)}
		other := u.tgtQPN + 1
		taken := false
		take := func() {
			taken = true
			e.takeReverse(c, acc)
			early, earlyTGT := m.early, m.earlyTGT
			m.early, m.earlyTGT = nil, nil
			for i, p := range early {
				m.deliver(tag, earlyTGT[i], true, p, tag, 0, u.tgtQPN, noTGT, peerTag)
			}
			e.mu.Lock()
			defer e.mu.Unlock()
			if !c.revTaken || c.revErr != nil || c.recvLeg == nil {
				t.Fatalf("reverse leg not taken: %v", c.revErr)
			}
		}
		for i := 0; len(msgs) >= 2; i++ {
			if i == int(split) {
				take()
			}
			sel, n := msgs[0], int(msgs[1])
			msgs = msgs[2:]
			n = min(n, len(msgs))
			p := append([]byte(nil), msgs[:n]...)
			msgs = msgs[n:]
			if sel&2 != 0 && len(p) >= 13 {
				binary.BigEndian.PutUint32(p[9:], tag)
			}
			tgt := u.tgtQPN
			if sel&1 != 0 {
				tgt = other
			}
			wc := kernel.RecvCompletion{Imm: tag, TGTQPN: tgt, Payload: p}
			kept := e.deliver(&wc)
			if taken {
				m.deliver(tag, tgt, true, p, tag, 0, u.tgtQPN, noTGT, peerTag)
			} else {
				m.deliver(tag, tgt, true, p, 0, tag, u.tgtQPN, noTGT, peerTag)
			}
			if kept != m.kept {
				t.Fatalf("message %x through %#x (replayed %v): kept %v, the model %v", p, tgt, taken, kept, m.kept)
			}
		}
		if !taken {
			take()
		}
		e.mu.Lock()
		defer e.mu.Unlock()
		if got := [3]uint64{e.dropped.Load(), e.duplicates.Load(), e.overruns.Load()}; got != [3]uint64{m.dropped, m.dups, m.overruns} {
			t.Fatalf("dropped, duplicates, overruns %v, the model %v", got, [3]uint64{m.dropped, m.dups, m.overruns})
		}
		if c.q.Len() != len(m.q) {
			t.Fatalf("queue of %d, the model %d", c.q.Len(), len(m.q))
		}
		for i := range m.q {
			if !bytes.Equal(*c.q.At(i), m.q[i]) {
				t.Fatalf("queued #%d %x, the model %x", i, *c.q.At(i), m.q[i])
			}
		}
		if (c.err != nil) != m.failed || (c.err != nil && !errors.Is(c.err, ErrProtocol)) {
			t.Fatalf("connection error %v, the model failed %v", c.err, m.failed)
		}
		if c.finRcvd != m.fin || (e.recv[tag] == c) != m.registered {
			t.Fatalf("FIN %v, registered %v; the model %v, %v", c.finRcvd, e.recv[tag] == c, m.fin, m.registered)
		}
		if c.acked != 0 || len(c.early) != 0 {
			t.Fatalf("acked %d with nothing sent; %d early messages left", c.acked, len(c.early))
		}
	})
}
