package cm

import (
	"encoding/binary"
	"fmt"
)

// Every message of a framed connection starts with an 8-byte header:
//
//	0      kind (frameData, frameCredit, frameFin)
//	1      flags (flagImm, flagStarved)
//	2..3   credits the sender returns (receive buffers it reposted)
//	4..7   sequence number, +1 per frame, so loss or garbage is detected
//
// Credits make flow control explicit: a sender never posts more messages than
// the peer has receive buffers for, so no RNR retry is ever needed.
const frameHeaderLen = 8

type frameKind uint8

const (
	frameData   frameKind = 1
	frameCredit frameKind = 2 // credit return only, no payload
	frameFin    frameKind = 3 // graceful close: no more data follows
)

const (
	flagImm     = 1 << 0
	flagStarved = 1 << 1 // the sender has no credit left for data: return credits now
)

type frameHeader struct {
	kind    frameKind
	flags   uint8
	credits uint16
	seq     uint32
}

func (h frameHeader) put(b []byte) {
	b[0] = byte(h.kind)
	b[1] = h.flags
	binary.BigEndian.PutUint16(b[2:], h.credits)
	binary.BigEndian.PutUint32(b[4:], h.seq)
}

// parseFrame validates a received frame of n bytes against the expected
// sequence number and the connection's limits. b holds at least n bytes.
func parseFrame(b []byte, n int, wantSeq uint32, maxPayload int, maxCredits int) (frameHeader, error) {
	if n < frameHeaderLen {
		return frameHeader{}, fmt.Errorf("%w: frame of %d bytes is shorter than its header", ErrProtocol, n)
	}
	h := frameHeader{
		kind:    frameKind(b[0]),
		flags:   b[1],
		credits: binary.BigEndian.Uint16(b[2:]),
		seq:     binary.BigEndian.Uint32(b[4:]),
	}
	switch h.kind {
	case frameData:
	case frameCredit, frameFin:
		if n != frameHeaderLen {
			return h, fmt.Errorf("%w: control frame with %d bytes of payload", ErrProtocol, n-frameHeaderLen)
		}
	default:
		return h, fmt.Errorf("%w: unknown frame kind %d", ErrProtocol, b[0])
	}
	if h.flags&^(flagImm|flagStarved) != 0 {
		return h, fmt.Errorf("%w: unknown frame flags %#x", ErrProtocol, h.flags)
	}
	if h.seq != wantSeq {
		return h, fmt.Errorf("%w: frame sequence %d, want %d", ErrProtocol, h.seq, wantSeq)
	}
	if int(h.credits) > maxCredits {
		return h, fmt.Errorf("%w: peer returned %d credits, more than the %d it can owe", ErrProtocol, h.credits, maxCredits)
	}
	if n-frameHeaderLen > maxPayload {
		return h, fmt.Errorf("%w: %d-byte message exceeds the agreed maximum %d", ErrProtocol, n-frameHeaderLen, maxPayload)
	}
	return h, nil
}
