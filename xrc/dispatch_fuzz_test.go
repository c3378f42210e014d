package xrc

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"testing"

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
// overrun, or a number past the replay window) or, for a first frame,
// errAbandoned; a credit frame never moves acked past sent (0 here); a
// keepalive with a body is dropped (counted).
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
	f.Add(join(data(0x7fffffff, "far"), data(0, "old"), data(5, "x"), data(6, "y"), data(7, "z")), uint8(1), false)
	f.Add(join([]byte("Hjunk"), data(0, "a")), uint8(1), false)
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
			finBefore, errBefore := c.finRcvd, c.err
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
			if c.acked != 0 {
				t.Fatalf("acked %d with nothing sent", c.acked)
			}
		}
	})
}

// FuzzDeliver drives the receive loop's whole dispatch (Endpoint.deliver):
// each message has a tag (the leg's, an unknown one, or the reserved tag
// of a reverse leg not registered yet), a TGT (the leg's, a number it moved
// away from, another sender's), a status and a payload. Whatever comes: no
// panic; nothing through a TGT the leg never received through is queued;
// the early list stays within its bound; nothing is kept for an unknown tag.
func FuzzDeliver(f *testing.F) {
	const tag, peerTag, early = 0x2222, 0x1111, 0x3333
	const tgt, oldTGT, otherTGT = 0x50, 0x40, 0x60
	f.Add([]byte{0, 6, 'D', 0, 0, 0, 0, 'x', 0x11, 1, 'H', 0x20, 1, 'H', 0x04, 6, 'D', 0, 0, 0, 1, 'y'}, uint8(1))
	f.Add([]byte{0x12, 6, 'D', 0, 0, 0, 0, 'x', 0x02, 0, 0x40, 3, 'C', 0, 0}, uint8(4))
	f.Fuzz(func(t *testing.T, msgs []byte, window uint8) {
		e := &Endpoint{cfg: Config{RecvWindow: int(window%8) + 1}, conns: map[*Conn]struct{}{}, pending: map[uint32]*Conn{},
			recv: map[uint32]*Conn{}, acc: newAcceptor(acceptorConfig{})}
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
		for len(msgs) >= 2 {
			sel, n := msgs[0], int(msgs[1])
			msgs = msgs[2:]
			n = min(n, len(msgs))
			p := append([]byte(nil), msgs[:n]...)
			msgs = msgs[n:]
			wc := kernel.RecvCompletion{Imm: []uint32{tag, early, 0x9999, 0}[sel&3], TGTQPN: []uint32{tgt, oldTGT, otherTGT, 0}[sel>>2&3], Payload: p}
			if sel&0x40 != 0 {
				wc.Status = verbs.WCLocLenErr
			}
			e.mu.Lock()
			qBefore, earlyBefore := c.q.Len(), len(d.early)
			e.mu.Unlock()
			kept := e.deliver(&wc)
			e.mu.Lock()
			switch {
			case kept && wc.Imm == tag && (wc.TGTQPN == otherTGT || wc.TGTQPN == 0 || c.q.Len() != qBefore+1):
				t.Fatalf("kept %x through TGT %#x (queue %d -> %d)", p, wc.TGTQPN, qBefore, c.q.Len())
			case kept && wc.Imm == early && len(d.early) != earlyBefore+1:
				t.Fatalf("kept early, list %d -> %d", earlyBefore, len(d.early))
			case kept && wc.Imm != tag && wc.Imm != early:
				t.Fatalf("kept a message for unknown tag %#x", wc.Imm)
			case kept && wc.Status != verbs.WCSuccess:
				t.Fatal("kept a failed receive")
			case len(d.early) > maxQueued(e.cfg.RecvWindow) || c.q.Len() > maxQueued(e.cfg.RecvWindow):
				t.Fatalf("early %d, queue %d over %d", len(d.early), c.q.Len(), maxQueued(e.cfg.RecvWindow))
			}
			e.mu.Unlock()
		}
	})
}
