package cm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"testing"
)

// FuzzConnRecv: any receive completions a peer can cause (7 bytes each: imm,
// length up to 64 KiB, flags hasImm|written), then the peer vanishes. Recv
// returns only injected messages, in order, byte- and imm-exact, within
// MaxRecvSize; it ends in io.EOF, ErrPeerGone or ErrProtocol; the credits
// kept never pass the peer's slots, even on a Conn failed for too many (it
// kept the peer's count before checking it); Close returns.
func FuzzConnRecv(f *testing.F) {
	f.Add(false, []byte{0x40, 0, 0, 0, 0, 10, 1, 0x50, 0, 0, 1, 0, 8, 1}) // data 0; data 1 with imm
	f.Add(false, []byte{0xC0, 0, 0, 0, 0, 0, 1, 0x80, 1, 0, 1, 0, 0, 1})  // FIN 0; credit 1 returning 1
	f.Add(true, []byte{0, 0, 0, 0, 1, 44, 0, 0, 0, 0, 7, 0, 5, 3})        // 300 bytes; a write with imm
	f.Fuzz(func(t *testing.T, raw bool, recs []byte) {
		_, b, w := fakePair(t, fakeOpts{raw: raw})
		e := w.ends[1]
		key := func(ok bool, imm uint32, p []byte) string { return fmt.Sprint(ok, map[bool]uint32{true: imm}[ok], p) }
		var sent []string // what each completion delivers, if valid
		for i := 0; len(recs) >= 7; i, recs = i+1, recs[7:] {
			imm, n, fl := binary.BigEndian.Uint32(recs), int(binary.BigEndian.Uint16(recs[4:])), recs[6]
			w.mu.Lock()
			if len(e.posted) == 0 {
				w.mu.Unlock()
				break
			}
			slot, buf := e.posted[0], e.recvBufs[e.posted[0]]
			e.posted = e.posted[1:]
			copy(buf, bytes.Repeat([]byte{byte(i), byte(7*i + 1)}, len(buf))) // what the peer sent
			e.cq = append(e.cq, completion{op: compRecv, slot: slot, n: n, imm: imm, hasImm: fl&1 != 0, written: fl&2 != 0})
			e.signal()
			w.mu.Unlock()
			p, ok := buf[:min(n, len(buf))], fl&1 != 0
			if fl&2 != 0 { // an RDMA write with imm fills no buffer
				p = nil
			}
			if !raw {
				if ok = imm&(1<<28) != 0 && len(p) >= userImmLen; ok {
					imm, p = binary.BigEndian.Uint32(p), p[userImmLen:]
				}
			}
			sent = append(sent, key(ok, imm, p))
		}
		b.peerGone("fuzz: the peer vanished")
		ctx, out := ctxT(t), make([]byte, 1<<17)
		for {
			n, imm, ok, err := b.RecvWithImm(ctx, out)
			if err != nil {
				if !errors.Is(err, io.EOF) && !errors.Is(err, ErrPeerGone) && !errors.Is(err, ErrProtocol) {
					t.Fatalf("ended with %v", err)
				}
				break
			}
			for len(sent) > 0 && sent[0] != key(ok, imm, out[:n]) {
				sent = sent[1:]
			}
			if n > b.MaxRecvSize() || len(sent) == 0 {
				t.Fatalf("Recv returned %x (imm %v %#x): not injected, or in another order", out[:n], ok, imm)
			}
			sent = sent[1:]
		}
		b.mu.Lock()
		credits, slots := b.credits, b.peerSlots
		b.mu.Unlock()
		if credits > slots { // kept only once checked
			t.Fatalf("%d credits, the peer has %d slots", credits, slots)
		}
		closesPromptly(t, b)
	})
}
