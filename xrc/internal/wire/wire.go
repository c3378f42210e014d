package wire

import (
	"encoding/binary"
	"fmt"
)

// Magic marks our private data; anything else (another library's, the kernel's
// all-zero rejects) is not ours.
const Magic uint16 = 0x5852

// Version is the protocol version this package speaks. MinVersion..MaxVersion
// is the range it accepts (sent back in REJECT(VERSION)).
// Version 2 added the receivers' largest message to REQ and ACCEPT;
// version 3 the move generation to REQ; version 4 changed no layout: a
// dialer's first frame on its forward leg completes the acceptor's half
// whichever way the reverse leg comes (with version 3 only one-exchange
// dials sent it, and a version-3 dialer's two-exchange connections would
// never come up at a version-4 acceptor).
const (
	Version    uint8 = 4
	MinVersion uint8 = 4
	MaxVersion uint8 = 4
)

// rejectVersion is the version a REJECT's header carries, whatever the
// version spoken: REJECT's layout is frozen as version 1 had it, so that a
// peer of any version reads REJECT(VERSION) and the range in it, and a
// REJECT of any version decodes here.
const rejectVersion uint8 = 1

// The range of a REQ's or ACCEPT's MaxMessage: the largest message a
// receiver takes (its SRQ's slot, less the frame header).
const (
	MinMessage = 64
	MaxMessage = 1 << 20
)

// HeaderLen is the size of the common header.
const HeaderLen = 8

// Carrier budgets of the kernel CM (private data bytes, IP addressing).
const (
	BudgetREQ     = 56
	BudgetREP     = 196
	BudgetREJ     = 148
	BudgetSIDRREQ = 180
	BudgetSIDRREP = 136
)

// Fixed (non-app) lengths, header included, and the resulting app-data
// maxima.
const (
	reqFixed    = 54
	acceptFixed = 45
	rejectFixed = 29
	// FinLen is the exact length of a FIN frame.
	FinLen = 16

	MaxPhysReqApp = BudgetREQ - reqFixed        // 2
	MaxVirtReqApp = BudgetSIDRREQ - reqFixed    // 126
	MaxAcceptApp  = BudgetSIDRREP - acceptFixed // 91
	MaxRejectApp  = BudgetSIDRREP - rejectFixed // 107

	maxQPN = 1<<24 - 1 // QPNs and SRQNs are 24-bit
	minQPN = 2         // QP0 and QP1 are the special QPs

	acceptMaxIn  = BudgetREP     // an ACCEPT may arrive in a REP...
	acceptMaxOut = BudgetSIDRREP // ...but must also fit a SIDR REP
	rejectMaxIn  = BudgetREJ     // a REJECT may arrive in a REJ...
	rejectMaxOut = BudgetSIDRREP // ...or a SIDR REP
	finMax       = FinLen        // FIN is in-band: no padding
)

// Type is the message type.
type Type uint8

const (
	TypePhysReq Type = 1 // REQ that creates an INI/TGT pair (connected-mode CM REQ)
	TypeVirtReq Type = 2 // REQ that joins an existing TGT (SIDR REQ)
	TypeAccept  Type = 3
	TypeReject  Type = 4
	TypeFIN     Type = 5 // in-band, on the data path
)

func (t Type) String() string {
	switch t {
	case TypePhysReq:
		return "PHYS_REQ"
	case TypeVirtReq:
		return "VIRT_REQ"
	case TypeAccept:
		return "ACCEPT"
	case TypeReject:
		return "REJECT"
	case TypeFIN:
		return "FIN"
	}
	return fmt.Sprintf("Type(%d)", uint8(t))
}

// Flags modify a REQ.
type Flags uint8

const (
	// FlagReciprocal marks the reverse leg of a bidirectional connection;
	// PeerTag then names the forward leg.
	FlagReciprocal Flags = 1 << 0
	// FlagReplacesTGT marks a PHYS_REQ from a sender that rebuilt its uplink;
	// TGTQPNHint then names the TGT being replaced.
	FlagReplacesTGT Flags = 1 << 1
	// FlagMove marks a REQ from a sender recovering its uplink: the leg
	// (Incarnation, ConnTag) already exists at the acceptor and moves onto
	// the TGT this REQ creates (PHYS) or names (VIRT), keeping its acceptor
	// tag. An acceptor without that leg rejects it.
	FlagMove Flags = 1 << 2
	// FlagOneExchange marks a forward VIRT_REQ whose sender can register the
	// reverse leg itself from the ACCEPT: PeerTag is then the tag the sender
	// will receive the reverse leg on. An acceptor with a live uplink to the
	// sender's node may answer with an ACCEPT flagged AcceptReverse instead of
	// a reciprocal VIRT_REQ. Never with FlagReciprocal or FlagMove.
	FlagOneExchange Flags = 1 << 3
	// FlagAbort marks a reciprocal VIRT_REQ that makes no leg: the sender's
	// reverse leg for the forward leg PeerTag will not come (its half of
	// the connection failed), so the dial waiting for it fails now. Only
	// with FlagReciprocal, naming no QP and no domain (INIQPN, TGTQPNHint
	// and DomainHint 0).
	FlagAbort Flags = 1 << 4

	knownFlags = FlagReciprocal | FlagReplacesTGT | FlagMove | FlagOneExchange | FlagAbort
)

// FINHalf is the only FIN flag: the sender's data ends (a half-close), and
// its leg stays up for the credit frames and keepalives that the peer's own
// messages need, until an unflagged FIN ends it.
const FINHalf Flags = 1 << 0

// AcceptReverse is the only ACCEPT flag: the ACCEPT carries a Reverse
// section (the reverse leg, for the requester to register itself). Only an
// answer to a REQ flagged FlagOneExchange may carry it.
const AcceptReverse Flags = 1 << 3

// RejectReason is the protocol's reason in a REJECT.
type RejectReason uint8

const (
	RejectVersion        RejectReason = 1
	RejectNoXRC          RejectReason = 2
	RejectTGTGone        RejectReason = 3
	RejectDomainMismatch RejectReason = 4
	RejectBusyRetry      RejectReason = 5
	RejectApp            RejectReason = 6
	RejectBadRequest     RejectReason = 7
)

func (r RejectReason) String() string {
	names := [...]string{"", "VERSION", "NO_XRC", "TGT_GONE", "DOMAIN_MISMATCH", "BUSY_RETRY", "APP_REJECT", "BAD_REQUEST"}
	if r >= 1 && int(r) < len(names) {
		return names[r]
	}
	return fmt.Sprintf("RejectReason(%d)", uint8(r))
}

// Header is the common 8-byte header.
type Header struct {
	Version uint8
	Type    Type
	Flags   Flags
	Length  uint16 // whole message, header included
}

// maxIn is the largest input (carrier maximum) accepted for a type.
func maxIn(t Type) int {
	switch t {
	case TypePhysReq:
		return BudgetREQ
	case TypeVirtReq:
		return BudgetSIDRREQ
	case TypeAccept:
		return acceptMaxIn
	case TypeReject:
		return rejectMaxIn
	case TypeFIN:
		return finMax
	}
	return 0
}

// minLen is the fixed part of a type, header included.
func minLen(t Type) int {
	switch t {
	case TypePhysReq, TypeVirtReq:
		return reqFixed
	case TypeAccept:
		return acceptFixed
	case TypeReject:
		return rejectFixed
	case TypeFIN:
		return FinLen
	}
	return HeaderLen
}

// maxOut is the largest encoding allowed for a type (its smallest carrier).
func maxOut(t Type) int {
	switch t {
	case TypeAccept:
		return acceptMaxOut
	case TypeReject:
		return rejectMaxOut
	}
	return maxIn(t)
}

// DecodeHeader checks the header of b as a message of the wanted type and
// returns it. It checks magic, version, type, reserved byte, the declared
// length against the input and the type's budget, and that the padding after
// the declared length is zero.
func DecodeHeader(b []byte, want Type) (Header, error) {
	var h Header
	if len(b) < 4 {
		return h, decErr(ReasonShort, "header")
	}
	if binary.BigEndian.Uint16(b[0:2]) != Magic {
		return h, decErr(ReasonMagic, "magic")
	}
	h.Version = b[2]
	if h.Version != Version && !(want == TypeReject && h.Version >= rejectVersion) {
		// Checked before anything else after the magic: a peer of another
		// version may lay out the rest differently, and it must get REJECT(VERSION).
		return h, decErr(ReasonVersion, "version")
	}
	if len(b) < HeaderLen {
		return h, decErr(ReasonShort, "header")
	}
	h.Type = Type(b[3])
	if h.Type != want {
		return h, decErr(ReasonType, "type")
	}
	h.Flags = Flags(b[4])
	if b[5] != 0 {
		return h, decErr(ReasonReserved, "reserved")
	}
	h.Length = binary.BigEndian.Uint16(b[6:8])
	if len(b) > maxIn(want) {
		return h, decErr(ReasonTooLong, "input")
	}
	if int(h.Length) < minLen(want) || int(h.Length) > maxOut(want) {
		return h, decErr(ReasonLength, "length")
	}
	if int(h.Length) > len(b) {
		return h, decErr(ReasonShort, "length")
	}
	for _, c := range b[h.Length:] {
		if c != 0 {
			return h, decErr(ReasonTrailing, "padding")
		}
	}
	return h, nil
}

func putHeader(b []byte, t Type, f Flags, n int) {
	binary.BigEndian.PutUint16(b[0:2], Magic)
	b[2] = Version
	if t == TypeReject {
		b[2] = rejectVersion
	}
	b[3] = byte(t)
	b[4] = byte(f)
	b[5] = 0
	binary.BigEndian.PutUint16(b[6:8], uint16(n))
}

func put24(b []byte, v uint32) { b[0], b[1], b[2] = byte(v>>16), byte(v>>8), byte(v) }
func get24(b []byte) uint32    { return uint32(b[0])<<16 | uint32(b[1])<<8 | uint32(b[2]) }

func validQPN(v uint32) bool { return v >= minQPN && v <= maxQPN }
