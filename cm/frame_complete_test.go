package cm

import (
	"bytes"
	"errors"
	"math"
	"testing"

	"github.com/goxrc/goxrc/internal/fuzzpick"
)

// Completeness and exact refusal for the framed connection's wire: the
// hello (hello.go's layout; the ranges of WithQueueDepth, "here and in a
// peer's handshake", and WithMessageSize; a keepalive target of probeLen
// bytes that does not wrap) and the frame header (frame.go's bit layout and
// parseFrame's rules). FuzzParseHello, FuzzPeerHello and FuzzParseFrame
// check that what is accepted is valid; these check that everything valid
// is accepted, as it was sent, and that at every bound exactly the invalid
// side is refused.

// helloLayout writes h as hello.go's comment lays it out, big-endian.
func helloLayout(h hello) []byte {
	be := func(b []byte, v uint64) {
		for i := range b {
			b[i] = byte(v >> (8 * (len(b) - 1 - i)))
		}
	}
	b := make([]byte, 28)
	copy(b, "GXRC")
	b[4], b[5] = 2, 28
	be(b[8:10], uint64(h.queueDepth))
	be(b[12:16], uint64(h.maxMessage))
	be(b[16:24], h.probe.addr)
	be(b[24:28], uint64(h.probe.rkey))
	return b
}

// helloValid: a depth of 2 to 4000, a message size of 1 byte to 1 GiB, and
// a keepalive target whose probeLen bytes do not wrap the address space.
func helloValid(h hello) bool {
	return h.queueDepth >= 2 && h.queueDepth <= 4000 && h.maxMessage >= 1 && h.maxMessage <= 1<<30 &&
		h.probe.addr <= math.MaxUint64-8
}

// checkHello marshals h and parses it back as the kernel delivers it, in a
// REQ (56 bytes) and a REP (196): accepted exactly when valid, then equal.
func checkHello(t *testing.T, h hello) bool {
	t.Helper()
	b := h.marshal()
	if want := helloLayout(h); !bytes.Equal(b, want) {
		t.Fatalf("%+v marshals as %x, the documented layout is %x", h, b, want)
	}
	for _, size := range []int{helloLen, 56, 196} {
		got, err := parseHello(append(bytes.Clone(b), make([]byte, size-len(b))...))
		switch {
		case err != nil && helloValid(h):
			t.Fatalf("%+v in %d bytes refused: %v", h, size, err)
		case err == nil && !helloValid(h):
			t.Fatalf("%+v in %d bytes accepted", h, size)
		case err != nil && !errors.Is(err, ErrProtocol):
			t.Fatalf("%+v refused with %v, not ErrProtocol", h, err)
		case err == nil && got != h:
			t.Fatalf("%+v in %d bytes parsed as %+v", h, size, got)
		}
	}
	return helloValid(h)
}

// FuzzHelloComplete: every valid hello survives marshal and parse.
func FuzzHelloComplete(f *testing.F) {
	for x := range uint64(8) {
		f.Add(uint16(x), uint32(x), x, uint32(x))
	}
	f.Fuzz(func(t *testing.T, depth uint16, msg uint32, addr uint64, rkey uint32) {
		h := hello{queueDepth: uint16(fuzzpick.Pick(uint64(depth), 2, 4000)), maxMessage: uint32(fuzzpick.Pick(uint64(msg), 1, 1<<30)),
			probe: probeTarget{addr: fuzzpick.Pick(addr, 0, math.MaxUint64-8), rkey: rkey}}
		if !checkHello(t, h) {
			t.Fatalf("the generator made an invalid hello %+v", h)
		}
	})
}

// TestHelloBoundaries: at each bound of each field, the valid side is
// accepted and the invalid side refused.
func TestHelloBoundaries(t *testing.T) {
	n := 0
	for _, depth := range []uint16{0, 1, 2, 3, 3999, 4000, 4001, 4095, math.MaxUint16} {
		for _, msg := range []uint32{0, 1, 2, 1<<30 - 1, 1 << 30, 1<<30 + 1, math.MaxUint32} {
			for _, addr := range []uint64{0, 1 << 47, math.MaxUint64 - 8, math.MaxUint64 - 7, math.MaxUint64} {
				for _, rkey := range []uint32{0, math.MaxUint32} {
					if checkHello(t, hello{queueDepth: depth, maxMessage: msg, probe: probeTarget{addr: addr, rkey: rkey}}) {
						n++
					}
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("no valid hello among the bounds")
	}
}

// frameRule is frame.go's contract for a received frame, written out from
// its comments: a header (immediate data) is present; the length is not
// negative; the kind is data, credit or FIN; a credit frame or FIN carries
// no payload and no immediate flag; the sequence number is the one
// expected; the credits returned are at most what the peer can owe; a
// frame flagged with immediate data has the 4 bytes for it; the payload
// (after those 4 bytes) is within the agreed maximum.
func frameRule(imm uint32, hasImm bool, n int, wantSeq uint16, maxPayload, maxCredits int) bool {
	kind, immFlag := imm>>30, imm&(1<<28) != 0
	credits, seq := int(imm>>16&0xfff), uint16(imm)
	payload := n
	if immFlag {
		payload -= 4
	}
	return hasImm && n >= 0 && kind >= 1 && kind <= 3 && (kind == 1 || (n == 0 && !immFlag)) &&
		seq == wantSeq && credits <= maxCredits && payload >= 0 && payload <= maxPayload
}

// frameLayout is the immediate data frame.go's comment gives a header:
// kind in bits 31..30, starved 29, immediate 28, credits 27..16, sequence
// 15..0.
func frameLayout(kind frameKind, starved, imm bool, credits, seq uint16) uint32 {
	v := uint32(kind)<<30 | uint32(credits)<<16 | uint32(seq)
	if starved {
		v |= 1 << 29
	}
	if imm {
		v |= 1 << 28
	}
	return v
}

// checkFrame parses a frame and holds the result against frameRule; an
// accepted one must come back as the header it encodes.
func checkFrame(t *testing.T, imm uint32, hasImm bool, n int, wantSeq uint16, maxPayload, maxCredits int) bool {
	t.Helper()
	h, err := parseFrame(imm, hasImm, n, wantSeq, maxPayload, maxCredits)
	ok := frameRule(imm, hasImm, n, wantSeq, maxPayload, maxCredits)
	switch {
	case err != nil && ok:
		t.Fatalf("valid frame %#08x (header %v, %d bytes, seq %d, max %d, credits %d) refused: %v", imm, hasImm, n, wantSeq, maxPayload, maxCredits, err)
	case err == nil && !ok:
		t.Fatalf("invalid frame %#08x (header %v, %d bytes, seq %d, max %d, credits %d) accepted as %+v", imm, hasImm, n, wantSeq, maxPayload, maxCredits, h)
	case err != nil && !errors.Is(err, ErrProtocol):
		t.Fatalf("frame refused with %v, not ErrProtocol", err)
	case err == nil && h.imm() != imm:
		t.Fatalf("frame %#08x parsed as %+v, which encodes as %#08x", imm, h, h.imm())
	}
	return ok
}

// FuzzFrameComplete: every frame a sender keeping to the rules may send (a
// data frame of up to the agreed maximum, with or without immediate data;
// a credit frame or FIN; any credits up to the peer's slots, any sequence
// number, starved or not) encodes as the documented bits and is accepted
// as the header it was built from.
func FuzzFrameComplete(f *testing.F) {
	for x := range uint8(16) {
		f.Add(x, uint16(x), uint16(x), uint32(x), uint32(x), uint16(x))
	}
	f.Fuzz(func(t *testing.T, sel uint8, credits, seq uint16, n, maxPayload uint32, maxCredits uint16) {
		kind := frameKind(1 + sel%3)
		starved, withImm := sel&4 != 0, sel&8 != 0 && kind == frameData
		slots := int(fuzzpick.Pick(uint64(maxCredits), 2, 4000)) // the peer's queue depth
		h := frameHeader{kind: kind, credits: uint16(fuzzpick.Pick(uint64(credits), 0, uint64(slots))), seq: seq}
		if starved {
			h.flags |= flagStarved
		}
		maxP := int(fuzzpick.Pick(uint64(maxPayload), 1, 1<<30))
		size := 0
		if kind == frameData {
			size = int(fuzzpick.Pick(uint64(n), 0, uint64(maxP)))
			if withImm {
				h.flags |= flagImm
				size += userImmLen
			}
		}
		imm := h.imm()
		if want := frameLayout(kind, starved, withImm, h.credits, seq); imm != want {
			t.Fatalf("%+v encodes as %#08x, the documented bits are %#08x", h, imm, want)
		}
		if !checkFrame(t, imm, true, size, seq, maxP, slots) {
			t.Fatalf("the generator made an invalid frame %+v of %d bytes", h, size)
		}
		got, _ := parseFrame(imm, true, size, seq, maxP, slots)
		if got != h {
			t.Fatalf("%+v parsed as %+v", h, got)
		}
	})
}

// TestFrameBoundaries: every kind and flag, at every bound of the
// credits, the length and the sequence number, parses exactly as
// frameRule says.
func TestFrameBoundaries(t *testing.T) {
	const maxP, slots, want = 100, 16, 7
	n := 0
	for kind := range frameKind(4) {
		for _, starved := range []bool{false, true} {
			for _, withImm := range []bool{false, true} {
				for _, credits := range []uint16{0, slots - 1, slots, slots + 1, maxFrameCredits} {
					for _, seq := range []uint16{want - 1, want, want + 1} {
						for _, size := range []int{-1, 0, 1, 3, 4, 5, maxP - 1, maxP, maxP + 1, maxP + 3, maxP + 4, maxP + 5} {
							for _, hasImm := range []bool{false, true} {
								imm := frameLayout(kind, starved, withImm, credits, seq)
								if checkFrame(t, imm, hasImm, size, want, maxP, slots) {
									n++
								}
							}
						}
					}
				}
			}
		}
	}
	if n == 0 {
		t.Fatal("no valid frame among the bounds")
	}
}
