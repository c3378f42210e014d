package cm

import (
	"encoding/binary"
	"fmt"
)

// Every message of a framed connection is sent with immediate data, whose
// 32 bits are the frame header:
//
//	31..30  kind (frameData, frameCredit, frameFin)
//	29      flagStarved: the sender has no credit left for data
//	28      flagImm: the payload starts with 4 bytes of the application's
//	        immediate data (SendWithImm), big-endian
//	27..16  credits the sender returns (receive buffers it reposted)
//	15..0   sequence number, +1 per frame (mod 2^16), so loss or garbage
//	        is detected
//
// Keeping the header out of the payload keeps a 4 KiB message in as many
// packets as 4 KiB takes. Credits make flow control explicit: a sender never
// posts more messages than the peer has receive buffers for, so no RNR retry
// is ever needed.
type frameKind uint8

const (
	frameData   frameKind = 1
	frameCredit frameKind = 2 // credit return only, no payload
	frameFin    frameKind = 3 // graceful close: no more data follows
)

const (
	flagStarved = 1 << 0
	flagImm     = 1 << 1

	// maxFrameCredits is what 12 bits carry; maxQueueDepth stays below.
	maxFrameCredits = 1<<12 - 1
	// userImmLen is the payload prefix that carries SendWithImm's data.
	userImmLen = 4
)

// A frame returns the receives reposted since our last return. Each frame a
// peer sends costs it a credit, so an honest peer's frames keep that count
// within our queue depth (one that ignores credits only gets fewer back):
// this fails to compile if the depth's limit outgrows what the header
// carries, which imm would silently cut.
const _ = uint(maxFrameCredits - maxQueueDepth)

type frameHeader struct {
	kind    frameKind
	flags   uint8
	credits uint16
	seq     uint16
}

func (h frameHeader) imm() uint32 {
	return uint32(h.kind)<<30 | uint32(h.flags&flagStarved)<<29 | uint32(h.flags&flagImm)>>1<<28 |
		uint32(h.credits&maxFrameCredits)<<16 | uint32(h.seq)
}

func putUserImm(b []byte, imm uint32) { binary.BigEndian.PutUint32(b, imm) }

// parseFrame validates a received frame of n payload bytes against the
// expected sequence number and the connection's limits.
func parseFrame(imm uint32, hasImm bool, n int, wantSeq uint16, maxPayload int, maxCredits int) (frameHeader, error) {
	if !hasImm {
		return frameHeader{}, fmt.Errorf("%w: frame without a header (a raw-mode peer?)", ErrProtocol)
	}
	if n < 0 {
		return frameHeader{}, fmt.Errorf("%w: negative frame length %d", ErrProtocol, n)
	}
	h := frameHeader{
		kind:    frameKind(imm >> 30),
		credits: uint16(imm >> 16 & maxFrameCredits),
		seq:     uint16(imm),
	}
	if imm&(1<<29) != 0 {
		h.flags |= flagStarved
	}
	if imm&(1<<28) != 0 {
		h.flags |= flagImm
	}
	switch h.kind {
	case frameData:
	case frameCredit, frameFin:
		if n != 0 || h.flags&flagImm != 0 {
			return h, fmt.Errorf("%w: control frame with %d bytes of payload", ErrProtocol, n)
		}
	default:
		return h, fmt.Errorf("%w: unknown frame kind %d", ErrProtocol, h.kind)
	}
	if h.seq != wantSeq {
		return h, fmt.Errorf("%w: frame sequence %d, want %d", ErrProtocol, h.seq, wantSeq)
	}
	if int(h.credits) > maxCredits {
		return h, fmt.Errorf("%w: peer returned %d credits, more than the %d it can owe", ErrProtocol, h.credits, maxCredits)
	}
	payload := n
	if h.flags&flagImm != 0 {
		if n < userImmLen {
			return h, fmt.Errorf("%w: %d-byte frame too short for its immediate data", ErrProtocol, n)
		}
		payload -= userImmLen
	}
	if payload > maxPayload {
		return h, fmt.Errorf("%w: %d-byte message exceeds the agreed maximum %d", ErrProtocol, payload, maxPayload)
	}
	return h, nil
}
