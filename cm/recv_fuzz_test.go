package cm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"testing"
)

// FuzzConnRecv: any receive completions a peer can cause (7 bytes each: imm,
// length up to 64 KiB, flags hasImm|written), on a Conn that owes the peer's
// credit returns for owed frames (so a frame may carry credits), then the
// peer vanishes. recvModel, written from the protocol's description and not
// from its parser, says which completions are messages and how the stream
// ends; Recv returns exactly those messages, in order, byte- and imm-exact,
// none skipped and none added, then the model's end (io.EOF, ErrProtocol or
// ErrPeerGone), again on the next call. The credits kept never pass the
// peer's slots, even on a Conn failed for too many (it kept the peer's count
// before checking it); Close returns.
//
// Framed, the low 16 bits of the i-th imm are XORed with i: zero is in
// sequence. Any sequence number can still be sent, but the fuzzer no longer
// has to count to reach a run of valid frames (from the first three seeds
// alone, 90 s of it found no third frame in sequence).
func FuzzConnRecv(f *testing.F) {
	f.Add(false, uint8(0), slices.Concat(recvRec(0x4000_0000, 10, 1), recvRec(0x5000_0000, 8, 1))) // data; data with imm
	f.Add(false, uint8(0), slices.Concat(recvRec(0xC000_0000, 0, 1), recvRec(0x8001_0000, 0, 1)))  // FIN; credit returning 1
	f.Add(true, uint8(0), slices.Concat(recvRec(0, 300, 0), recvRec(7, 5, 3)))                     // 300 bytes; a write with imm
	// Data returning credits, data with imm from a starved peer, the
	// message right before a FIN, then the FIN.
	f.Add(false, uint8(3), slices.Concat(recvRec(0x4002_0000, 5, 1), recvRec(0x7001_0000, 9, 1), recvRec(0x4000_0000, 3, 1), recvRec(0xC000_0000, 0, 1)))
	// A credit frame returning what was owed, data, then a frame returning
	// one more: ErrProtocol after the data.
	f.Add(false, uint8(2), slices.Concat(recvRec(0x8002_0000, 0, 1), recvRec(0x4000_0000, 1, 1), recvRec(0x4001_0000, 2, 1)))
	// The largest message, then one byte too many; data after a FIN; a
	// sequence gap after data.
	f.Add(false, uint8(0), slices.Concat(recvRec(0x4000_0000, 256, 1), recvRec(0x4000_0000, 257, 1)))
	f.Add(false, uint8(0), slices.Concat(recvRec(0x4000_0000, 1, 1), recvRec(0xC000_0000, 0, 1), recvRec(0x4000_0000, 1, 1)))
	f.Add(false, uint8(0), slices.Concat(recvRec(0x4000_0000, 2, 1), recvRec(0x4000_0003, 2, 1)))
	// Raw: a plain message, a write notice longer than the buffer, an
	// empty one without imm, then one longer than the buffer.
	f.Add(true, uint8(0), slices.Concat(recvRec(9, 3, 0), recvRec(8, 1000, 3), recvRec(7, 0, 0), recvRec(6, 257, 1)))
	f.Fuzz(func(t *testing.T, raw bool, owed uint8, recs []byte) {
		_, b, w := fakePair(t, fakeOpts{raw: raw})
		e := w.ends[1]
		b.mu.Lock()
		slots, credits := b.peerSlots, b.peerSlots
		if !raw {
			// As if b had sent owed frames the peer took and reposted
			// for, their credits not yet returned: the peer may return
			// up to owed. Its buffers are all posted, so whatever b
			// sends with the credits returned finds one.
			credits -= int(owed) % (slots + 1)
			b.credits = credits
		}
		b.mu.Unlock()
		// Injected under the wire's lock, so that a round takes in all
		// of them or none: with nothing else in flight and no timer
		// armed, nothing is left to chance (no slack in the oracle).
		var in []peerRecv
		w.mu.Lock()
		for i := 0; len(recs) >= 7 && len(e.posted) > 0; i, recs = i+1, recs[7:] {
			r := peerRecv{imm: binary.BigEndian.Uint32(recs), n: int(binary.BigEndian.Uint16(recs[4:])), hasImm: recs[6]&1 != 0, written: recs[6]&2 != 0}
			if !raw {
				r.imm ^= uint32(i) // see above: zero is in sequence
			}
			slot := e.posted[0]
			e.posted = e.posted[1:]
			buf := e.recvBufs[slot]
			copy(buf, bytes.Repeat([]byte{byte(i), byte(7*i + 1)}, len(buf))) // what the peer sent
			r.buf = slices.Clone(buf)
			e.cq = append(e.cq, completion{op: compRecv, slot: slot, n: r.n, imm: r.imm, hasImm: r.hasImm, written: r.written})
			in = append(in, r)
		}
		e.signal()
		w.mu.Unlock()
		msgs, end := recvModel(raw, in, b.MaxRecvSize(), slots, credits)
		b.peerGone("fuzz: the peer vanished")
		ctx, out := ctxT(t), make([]byte, 1<<17)
		for i := 0; ; i++ {
			n, imm, ok, err := b.RecvWithImm(ctx, out)
			if err != nil {
				if i < len(msgs) {
					t.Fatalf("Recv %d: %v; the model has message %v first (%d messages, then %v)", i, err, msgs[i], len(msgs), end)
				}
				checkEnd(t, err, end)
				break
			}
			got := modelMsg{ok: ok, imm: imm, p: out[:n]}
			if i >= len(msgs) {
				t.Fatalf("Recv %d returned %v; the model ends with %v after %d messages", i, got, end, len(msgs))
			}
			if !got.equal(msgs[i]) {
				t.Fatalf("Recv %d returned %v, the model says %v", i, got, msgs[i])
			}
		}
		_, _, _, err := b.RecvWithImm(ctx, out)
		checkEnd(t, err, end) // the end stays
		b.mu.Lock()
		credits, slots = b.credits, b.peerSlots
		b.mu.Unlock()
		if credits > slots { // kept only once checked
			t.Fatalf("%d credits, the peer has %d slots", credits, slots)
		}
		closesPromptly(t, b)
	})
}

// recvRec is one completion as FuzzConnRecv reads it: imm, length, flags
// (1: with imm, 2: an RDMA write with imm).
func recvRec(imm uint32, n uint16, flags byte) []byte {
	return append(binary.BigEndian.AppendUint16(binary.BigEndian.AppendUint32(nil, imm), n), flags)
}

// peerRecv is a receive completion the peer caused, with its buffer's
// content.
type peerRecv struct {
	imm             uint32
	n               int
	hasImm, written bool
	buf             []byte
}

// modelMsg is a message Recv returns: imm counts only with ok.
type modelMsg struct {
	ok  bool
	imm uint32
	p   []byte
}

func (m modelMsg) equal(o modelMsg) bool {
	return m.ok == o.ok && (!m.ok || m.imm == o.imm) && bytes.Equal(m.p, o.p)
}

func (m modelMsg) String() string {
	s := fmt.Sprintf("%d bytes [%x]", len(m.p), m.p[:min(len(m.p), 16)])
	if len(m.p) > 16 {
		s = s[:len(s)-1] + "...]"
	}
	if m.ok {
		s += fmt.Sprintf(" with imm %#x", m.imm)
	}
	return s
}

// recvModel is the receive side of the protocol, from frame.go's header
// description and hello.go's limits rather than its code: the messages the
// completions in make, in order, and how the stream ends after them for a
// peer that then vanishes. Raw, every completion is a message (an RDMA write
// with imm, a notice of no bytes) unless longer than its buffer. Framed,
// each is a frame whose header is the imm: kind in bits 31..30 (1 data, 2
// credit return, 3 FIN), 28 a payload that starts with 4 bytes of the
// application's imm, 27..16 credits returned, 15..0 the sequence number
// from 0; bit 29 (starved) never makes a frame wrong. A write, a frame
// without imm, longer than its buffer, of no known kind, out of sequence,
// returning more credits than are owed (slots less what the Conn holds),
// a control frame with payload, a data frame too short for its imm or whose
// message passes maxRecv: ErrProtocol, after the messages before it. A FIN
// ends with io.EOF after the data before it (what follows it cannot add a
// message, and comes after the application's end of stream); without one,
// the peer's vanishing is ErrPeerGone.
func recvModel(raw bool, in []peerRecv, maxRecv, slots, credits int) (msgs []modelMsg, end error) {
	var seq uint16
	for _, r := range in {
		if raw {
			switch {
			case r.written:
				msgs = append(msgs, modelMsg{ok: r.hasImm, imm: r.imm})
			case r.n > len(r.buf):
				return msgs, ErrProtocol
			default:
				msgs = append(msgs, modelMsg{ok: r.hasImm, imm: r.imm, p: r.buf[:r.n]})
			}
			continue
		}
		if r.written || !r.hasImm || r.n > len(r.buf) {
			return msgs, ErrProtocol
		}
		kind, withImm, back := r.imm>>30, r.imm&(1<<28) != 0, int(r.imm>>16&0xfff)
		switch {
		case kind == 0, kind != 1 && (r.n > 0 || withImm), uint16(r.imm) != seq, credits+back > slots:
			return msgs, ErrProtocol
		}
		seq++
		credits += back
		switch kind {
		case 1:
			m := modelMsg{p: r.buf[:r.n]}
			if withImm {
				if r.n < 4 {
					return msgs, ErrProtocol
				}
				m = modelMsg{ok: true, imm: binary.BigEndian.Uint32(r.buf), p: r.buf[4:r.n]}
			}
			if len(m.p) > maxRecv {
				return msgs, ErrProtocol
			}
			msgs = append(msgs, m)
		case 3:
			return msgs, io.EOF
		}
	}
	return msgs, ErrPeerGone
}

// checkEnd fails unless err is of end's class, and of no other of the three.
func checkEnd(t *testing.T, err, end error) {
	t.Helper()
	for _, class := range []error{io.EOF, ErrProtocol, ErrPeerGone} {
		if errors.Is(err, class) != (class == end) {
			t.Fatalf("Recv ended with %v, the model says %v", err, end)
		}
	}
}
