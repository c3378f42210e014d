package cm

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/goxrc/goxrc/rdmacm"
)

// The connection handshake of a framed connection travels as CM private
// data: in the REQ (56-byte budget) from the dialer and in the REP (196) from
// the acceptor. The kernel pads private data with zeros to the budget, so the
// message carries its own length.
//
//	0..3   magic "GXRC"
//	4      version (2)
//	5      length of this message (helloLen)
//	6..7   flags (reserved, zero)
//	8..9   receive queue depth: the credits the peer starts with
//	10..11 reserved, zero
//	12..15 maximum message payload the sender accepts
//	16..23 address of the sender's keepalive target (probeLen bytes)
//	24..27 its rkey
//
// The keepalive target is memory the peer may read and nothing else: a
// keepalive probe is an RDMA read of it, which the peer's device answers
// without its application (see WithKeepalive). Version 1 had no target;
// its probes were credit frames. A version 1 peer is refused, as it refuses
// version 2: no such peer is deployed, and a version 1 dialer would grant no
// reads anyway (its QP kept INIT's access flags of 0, see rdmacm.ID.MoveQP).
const (
	helloMagic   = 0x47585243 // "GXRC"
	helloVersion = 2
	helloLen     = 28
)

type hello struct {
	queueDepth uint16
	maxMessage uint32
	probe      probeTarget
}

// probeTarget is where a peer's keepalive probes read (probeLen bytes).
type probeTarget struct {
	addr uint64
	rkey uint32
}

func (h hello) marshal() []byte {
	b := make([]byte, helloLen)
	binary.BigEndian.PutUint32(b[0:], helloMagic)
	b[4] = helloVersion
	b[5] = helloLen
	binary.BigEndian.PutUint16(b[8:], h.queueDepth)
	binary.BigEndian.PutUint32(b[12:], h.maxMessage)
	binary.BigEndian.PutUint64(b[16:], h.probe.addr)
	binary.BigEndian.PutUint32(b[24:], h.probe.rkey)
	return b
}

// peerHello checks a framed peer's side of the CM exchange (its request or
// its reply): its hello, and that it lets us read its memory. Keepalive
// probes and ReadRemote are RDMA reads, and with no read credit (the peer
// offered no responder resources, which the CM reports to us as our
// initiator depth) the first read would wait for ever and every send
// behind it too, instead of failing. goxrc peers offer one.
func peerHello(ev rdmacm.Event) (hello, error) {
	h, err := parseHello(ev.PrivateData)
	if err == nil && ev.Conn.InitiatorDepth == 0 {
		err = fmt.Errorf("%w: the peer accepts no RDMA reads (responder resources 0)", ErrProtocol)
	}
	return h, err
}

// parseHello decodes a peer's hello; every field is untrusted.
func parseHello(b []byte) (hello, error) {
	if len(b) < helloLen {
		return hello{}, fmt.Errorf("%w: handshake of %d bytes, want at least %d", ErrProtocol, len(b), helloLen)
	}
	if m := binary.BigEndian.Uint32(b); m != helloMagic {
		return hello{}, fmt.Errorf("%w: handshake magic %#x is not goxrc's (a raw-mode peer?)", ErrProtocol, m)
	}
	if b[4] != helloVersion {
		return hello{}, fmt.Errorf("%w: handshake version %d, this side speaks %d", ErrProtocol, b[4], helloVersion)
	}
	if b[5] != helloLen {
		return hello{}, fmt.Errorf("%w: handshake length %d, want %d", ErrProtocol, b[5], helloLen)
	}
	if binary.BigEndian.Uint16(b[6:]) != 0 || binary.BigEndian.Uint16(b[10:]) != 0 {
		return hello{}, fmt.Errorf("%w: reserved handshake bits set", ErrProtocol)
	}
	for _, c := range b[helloLen:] {
		if c != 0 {
			return hello{}, fmt.Errorf("%w: garbage after the handshake", ErrProtocol)
		}
	}
	h := hello{
		queueDepth: binary.BigEndian.Uint16(b[8:]), maxMessage: binary.BigEndian.Uint32(b[12:]),
		probe: probeTarget{addr: binary.BigEndian.Uint64(b[16:]), rkey: binary.BigEndian.Uint32(b[24:])},
	}
	if h.queueDepth < minQueueDepth || h.queueDepth > maxQueueDepth {
		return hello{}, fmt.Errorf("%w: peer queue depth %d outside [%d, %d]", ErrProtocol, h.queueDepth, minQueueDepth, maxQueueDepth)
	}
	if h.maxMessage < minMessageSize || h.maxMessage > maxMessageSize {
		return hello{}, fmt.Errorf("%w: peer message size %d outside [%d, %d]", ErrProtocol, h.maxMessage, minMessageSize, maxMessageSize)
	}
	if h.probe.addr > math.MaxUint64-probeLen {
		return hello{}, fmt.Errorf("%w: keepalive target %#x wraps the address space", ErrProtocol, h.probe.addr)
	}
	return h, nil
}
