package wire

import "encoding/binary"

// Req is a PHYS_REQ or VIRT_REQ.
type Req struct {
	Type        Type  // TypePhysReq or TypeVirtReq
	Flags       Flags // FlagReciprocal, FlagReplacesTGT (PHYS only)
	ConnTag     uint32
	PeerTag     uint32 // non-zero exactly when FlagReciprocal (the forward leg's tag) or FlagOneExchange (the sender's receive tag for the reverse leg)
	Incarnation uint64 // random per sender process start; never 0
	INIQPN      uint32 // 24-bit; repeated because SIDR carries none
	TGTQPNHint  uint32 // VIRT: the TGT to join; PHYS: 0, or the replaced TGT with FlagReplacesTGT
	DomainHint  uint64 // 0 = unknown (PHYS only)
	SRQN        uint32 // sender's own SRQ for the reverse leg (24-bit)
	ReplyPort   uint16
	// Credits is the sender's receive window: how many messages the leg
	// that answers this connection (the reverse leg) may have queued at the
	// sender. Never 0.
	Credits uint16
	// MaxMessage is the largest message the sender takes on that leg
	// (MinMessage..MaxMessage).
	MaxMessage uint32
	// Move is the leg's move generation: 0 on the request that makes the
	// leg, and on each MOVE of it one more than on the last (a request
	// asked again may keep its number). The acceptor takes a MOVE only
	// past the generation it last took, so a late or replayed MOVE cannot
	// put the leg back on a TGT it left.
	Move   uint32
	appLen uint8
	app    [MaxVirtReqApp]byte
}

// App returns the application data (aliases r).
func (r *Req) App() []byte { return r.app[:r.appLen] }

// SetApp copies p into the application data.
func (r *Req) SetApp(p []byte) error {
	if len(p) > len(r.app) {
		return &EncodeError{ReasonAppLength, "app"}
	}
	r.appLen = uint8(copy(r.app[:], p))
	clear(r.app[r.appLen:])
	return nil
}

// Len is the encoded length.
func (r *Req) Len() int { return reqFixed + int(r.appLen) }

func (r *Req) validate() check {
	switch r.Type {
	case TypePhysReq, TypeVirtReq:
	default:
		return check{ReasonType, "type"}
	}
	if r.Flags&^knownFlags != 0 {
		return badFlags("unknown")
	}
	if r.ConnTag == 0 {
		return bad("conn tag")
	}
	if r.Flags&FlagReciprocal != 0 && r.Flags&FlagOneExchange != 0 {
		return badFlags("reciprocal and one-exchange")
	}
	if (r.Flags&(FlagReciprocal|FlagOneExchange) != 0) != (r.PeerTag != 0) {
		return badFlags("reciprocal/peer tag")
	}
	if r.Flags&FlagOneExchange != 0 && (r.Type != TypeVirtReq || r.Flags&FlagMove != 0) {
		return badFlags("one-exchange on PHYS_REQ or MOVE")
	}
	if (r.Flags&FlagMove != 0) != (r.Move != 0) {
		return bad("move generation")
	}
	if r.Incarnation == 0 {
		return bad("incarnation")
	}
	abort := r.Flags&FlagAbort != 0
	if abort && (r.Type != TypeVirtReq || r.Flags != FlagReciprocal|FlagAbort) {
		return badFlags("abort but on a plain reciprocal VIRT_REQ")
	}
	if abort {
		if r.INIQPN != 0 || r.TGTQPNHint != 0 || r.DomainHint != 0 {
			return bad("abort naming a QP or domain")
		}
	} else if !validQPN(r.INIQPN) {
		return bad("INI QPN")
	}
	if r.SRQN > maxQPN {
		return bad("SRQN")
	}
	if r.ReplyPort == 0 { // where the sender listens: reverse legs dial it
		return bad("reply port")
	}
	if r.Credits == 0 {
		return bad("credits")
	}
	if !validMessage(r.MaxMessage) {
		return bad("max message")
	}
	if r.Type == TypeVirtReq && !abort {
		if r.Flags&FlagReplacesTGT != 0 {
			return badFlags("replaces TGT on VIRT_REQ")
		}
		if !validQPN(r.TGTQPNHint) {
			return bad("TGT hint")
		}
		if r.DomainHint == 0 {
			return bad("domain hint")
		}
	} else if r.Flags&FlagReplacesTGT != 0 {
		if !validQPN(r.TGTQPNHint) {
			return bad("replaced TGT")
		}
	} else if r.TGTQPNHint != 0 {
		return bad("TGT hint on PHYS_REQ")
	}
	if r.Len() > maxOut(r.Type) {
		return check{ReasonAppLength, "app"}
	}
	return check{}
}

// Encode writes r into b and returns the length. It does not allocate.
func (r *Req) Encode(b []byte) (int, error) {
	if c := r.validate(); !c.ok() {
		return 0, c.enc()
	}
	n := r.Len()
	if len(b) < n {
		return 0, &EncodeError{ReasonShort, "buffer"}
	}
	putHeader(b, r.Type, r.Flags, n)
	binary.BigEndian.PutUint32(b[8:], r.ConnTag)
	binary.BigEndian.PutUint32(b[12:], r.PeerTag)
	binary.BigEndian.PutUint64(b[16:], r.Incarnation)
	put24(b[24:], r.INIQPN)
	put24(b[27:], r.TGTQPNHint)
	binary.BigEndian.PutUint64(b[30:], r.DomainHint)
	put24(b[38:], r.SRQN)
	binary.BigEndian.PutUint16(b[41:], r.ReplyPort)
	binary.BigEndian.PutUint16(b[43:], r.Credits)
	binary.BigEndian.PutUint32(b[45:], r.MaxMessage)
	binary.BigEndian.PutUint32(b[49:], r.Move)
	b[53] = r.appLen
	copy(b[reqFixed:n], r.App())
	return n, nil
}

// DecodeReq decodes a REQ of the wanted type (TypePhysReq from a
// connected-mode REQ, TypeVirtReq from a SIDR REQ) into r.
func DecodeReq(b []byte, want Type, r *Req) error {
	if want != TypePhysReq && want != TypeVirtReq {
		return decErr(ReasonType, "type")
	}
	h, err := DecodeHeader(b, want)
	if err != nil {
		return err
	}
	if int(h.Length) != reqFixed+int(b[53]) {
		return decErr(ReasonAppLength, "app")
	}
	*r = Req{
		Type:        h.Type,
		Flags:       h.Flags,
		ConnTag:     binary.BigEndian.Uint32(b[8:]),
		PeerTag:     binary.BigEndian.Uint32(b[12:]),
		Incarnation: binary.BigEndian.Uint64(b[16:]),
		INIQPN:      get24(b[24:]),
		TGTQPNHint:  get24(b[27:]),
		DomainHint:  binary.BigEndian.Uint64(b[30:]),
		SRQN:        get24(b[38:]),
		ReplyPort:   binary.BigEndian.Uint16(b[41:]),
		Credits:     binary.BigEndian.Uint16(b[43:]),
		MaxMessage:  binary.BigEndian.Uint32(b[45:]),
		Move:        binary.BigEndian.Uint32(b[49:]),
		appLen:      b[53],
	}
	copy(r.app[:], b[reqFixed:h.Length])
	return r.validate().dec()
}

// Accept is the acceptor's positive answer (REP or SIDR REP).
type Accept struct {
	Flags       Flags  // 0 or AcceptReverse
	TagEcho     uint32 // the REQ's ConnTag
	AcceptorTag uint32
	Incarnation uint64
	TGTQPN      uint32
	SRQN        uint32 // acceptor's SRQ for this connection
	DomainID    uint64
	Credits     uint16  // the acceptor's receive window for this leg; never 0
	MaxMessage  uint32  // the largest message the acceptor takes on this leg (MinMessage..MaxMessage)
	Rev         Reverse // with AcceptReverse only; zero otherwise
	appLen      uint8
	app         [MaxAcceptApp]byte
}

// Reverse is the acceptor's reverse leg, carried in an ACCEPT flagged
// AcceptReverse (ReverseLen bytes between the fixed part and the app data):
// the requester registers it itself (opens TGTQPN by number and verifies it)
// instead of the acceptor sending a reciprocal VIRT_REQ.
type Reverse struct {
	Tag      uint32 // the acceptor's ConnTag for the reverse leg (FIN's SenderTag)
	INIQPN   uint32 // the acceptor's INI on its uplink to the requester's node
	TGTQPN   uint32 // that uplink's TGT, in the requester's node
	DomainID uint64 // the domain that TGT is in (the requester's, if all is well)
}

// ReverseLen is the size of a Reverse section.
const ReverseLen = 18

// App returns the application data (aliases a).
func (a *Accept) App() []byte { return a.app[:a.appLen] }

// SetApp copies p into the application data.
func (a *Accept) SetApp(p []byte) error {
	if len(p) > len(a.app) {
		return &EncodeError{ReasonAppLength, "app"}
	}
	a.appLen = uint8(copy(a.app[:], p))
	clear(a.app[a.appLen:])
	return nil
}

// Len is the encoded length.
func (a *Accept) Len() int { return a.fixed() + int(a.appLen) }

func (a *Accept) fixed() int {
	if a.Flags&AcceptReverse != 0 {
		return acceptFixed + ReverseLen
	}
	return acceptFixed
}

func (a *Accept) validate() check {
	switch {
	case a.TagEcho == 0:
		return bad("tag echo")
	case a.AcceptorTag == 0:
		return bad("acceptor tag")
	case a.Incarnation == 0:
		return bad("incarnation")
	case !validQPN(a.TGTQPN):
		return bad("TGT QPN")
	case a.SRQN > maxQPN:
		return bad("SRQN")
	case a.DomainID == 0:
		return bad("domain id")
	case a.Credits == 0:
		return bad("credits")
	case !validMessage(a.MaxMessage):
		return bad("max message")
	case a.Flags&^AcceptReverse != 0:
		return badFlags("unknown")
	case a.Flags&AcceptReverse == 0 && a.Rev != (Reverse{}):
		return bad("reverse without flag")
	case a.Flags&AcceptReverse != 0 && (a.Rev.Tag == 0 || !validQPN(a.Rev.INIQPN) || !validQPN(a.Rev.TGTQPN) || a.Rev.DomainID == 0):
		return bad("reverse")
	case a.Len() > acceptMaxOut:
		return check{ReasonAppLength, "app"}
	}
	return check{}
}

// Encode writes a into b and returns the length. It does not allocate.
func (a *Accept) Encode(b []byte) (int, error) {
	if c := a.validate(); !c.ok() {
		return 0, c.enc()
	}
	n := a.Len()
	if len(b) < n {
		return 0, &EncodeError{ReasonShort, "buffer"}
	}
	putHeader(b, TypeAccept, a.Flags, n)
	binary.BigEndian.PutUint32(b[8:], a.TagEcho)
	binary.BigEndian.PutUint32(b[12:], a.AcceptorTag)
	binary.BigEndian.PutUint64(b[16:], a.Incarnation)
	put24(b[24:], a.TGTQPN)
	put24(b[27:], a.SRQN)
	binary.BigEndian.PutUint64(b[30:], a.DomainID)
	binary.BigEndian.PutUint16(b[38:], a.Credits)
	binary.BigEndian.PutUint32(b[40:], a.MaxMessage)
	b[44] = a.appLen
	if a.Flags&AcceptReverse != 0 {
		r := b[acceptFixed:]
		binary.BigEndian.PutUint32(r[0:], a.Rev.Tag)
		put24(r[4:], a.Rev.INIQPN)
		put24(r[7:], a.Rev.TGTQPN)
		binary.BigEndian.PutUint64(r[10:], a.Rev.DomainID)
	}
	copy(b[a.fixed():n], a.App())
	return n, nil
}

// DecodeAccept decodes an ACCEPT into a.
func DecodeAccept(b []byte, a *Accept) error {
	h, err := DecodeHeader(b, TypeAccept)
	if err != nil {
		return err
	}
	if h.Flags&^AcceptReverse != 0 {
		return decErr(ReasonFlags, "flags")
	}
	fixed := acceptFixed
	if h.Flags&AcceptReverse != 0 {
		fixed += ReverseLen
	}
	if int(h.Length) < fixed || int(h.Length) != fixed+int(b[44]) {
		return decErr(ReasonAppLength, "app")
	}
	*a = Accept{
		Flags:       h.Flags,
		TagEcho:     binary.BigEndian.Uint32(b[8:]),
		AcceptorTag: binary.BigEndian.Uint32(b[12:]),
		Incarnation: binary.BigEndian.Uint64(b[16:]),
		TGTQPN:      get24(b[24:]),
		SRQN:        get24(b[27:]),
		DomainID:    binary.BigEndian.Uint64(b[30:]),
		Credits:     binary.BigEndian.Uint16(b[38:]),
		MaxMessage:  binary.BigEndian.Uint32(b[40:]),
		appLen:      b[44],
	}
	if h.Flags&AcceptReverse != 0 {
		r := b[acceptFixed:]
		a.Rev = Reverse{Tag: binary.BigEndian.Uint32(r[0:]), INIQPN: get24(r[4:]), TGTQPN: get24(r[7:]),
			DomainID: binary.BigEndian.Uint64(r[10:])}
	}
	copy(a.app[:], b[fixed:h.Length])
	return a.validate().dec()
}

// Reject is the acceptor's negative answer (REJ or SIDR REP with reject status).
type Reject struct {
	Tag        uint32 // the REQ's ConnTag; 0 if the REQ was unreadable
	Reason     RejectReason
	MinVersion uint8 // versions the rejecter speaks
	MaxVersion uint8
	Detail     uint32 // reason-specific (e.g. an application code)
	DomainID   uint64 // the rejecter's domain; required for DOMAIN_MISMATCH, and TGT_GONE is heeded only with it
	appLen     uint8
	app        [MaxRejectApp]byte
}

// App returns the application data (aliases r).
func (r *Reject) App() []byte { return r.app[:r.appLen] }

// SetApp copies p into the application data.
func (r *Reject) SetApp(p []byte) error {
	if len(p) > len(r.app) {
		return &EncodeError{ReasonAppLength, "app"}
	}
	r.appLen = uint8(copy(r.app[:], p))
	clear(r.app[r.appLen:])
	return nil
}

// Len is the encoded length.
func (r *Reject) Len() int { return rejectFixed + int(r.appLen) }

func (r *Reject) validate() check {
	switch {
	case r.Reason < RejectVersion || r.Reason > RejectBadRequest:
		return bad("reason")
	case r.MinVersion == 0 || r.MinVersion > r.MaxVersion:
		return bad("version range")
	case r.Reason == RejectDomainMismatch && r.DomainID == 0:
		return bad("domain id")
	case r.Len() > rejectMaxOut:
		return check{ReasonAppLength, "app"}
	}
	return check{}
}

// Encode writes r into b and returns the length. It does not allocate.
func (r *Reject) Encode(b []byte) (int, error) {
	if c := r.validate(); !c.ok() {
		return 0, c.enc()
	}
	n := r.Len()
	if len(b) < n {
		return 0, &EncodeError{ReasonShort, "buffer"}
	}
	putHeader(b, TypeReject, 0, n)
	binary.BigEndian.PutUint32(b[8:], r.Tag)
	b[12] = byte(r.Reason)
	b[13] = r.MinVersion
	b[14] = r.MaxVersion
	b[15] = 0
	binary.BigEndian.PutUint32(b[16:], r.Detail)
	binary.BigEndian.PutUint64(b[20:], r.DomainID)
	b[28] = r.appLen
	copy(b[rejectFixed:n], r.App())
	return n, nil
}

// DecodeReject decodes a REJECT into r.
func DecodeReject(b []byte, r *Reject) error {
	h, err := DecodeHeader(b, TypeReject)
	if err != nil {
		return err
	}
	if h.Flags != 0 {
		return decErr(ReasonFlags, "flags")
	}
	if b[15] != 0 {
		return decErr(ReasonReserved, "reserved")
	}
	if int(h.Length) != rejectFixed+int(b[28]) {
		return decErr(ReasonAppLength, "app")
	}
	*r = Reject{
		Tag:        binary.BigEndian.Uint32(b[8:]),
		Reason:     RejectReason(b[12]),
		MinVersion: b[13],
		MaxVersion: b[14],
		Detail:     binary.BigEndian.Uint32(b[16:]),
		DomainID:   binary.BigEndian.Uint64(b[20:]),
		appLen:     b[28],
	}
	copy(r.app[:], b[rejectFixed:h.Length])
	return r.validate().dec()
}

// FIN is the in-band last message of a leg: the receiver drops its local
// count for the connection after consuming it.
type FIN struct {
	Tag       uint32 // the receiver's tag (what every message on the leg carries)
	SenderTag uint32
	Half      bool // FINHalf: the data ends, the leg does not
}

func (f *FIN) validate() check {
	if f.Tag == 0 {
		return bad("tag")
	}
	if f.SenderTag == 0 {
		return bad("sender tag")
	}
	return check{}
}

// Encode writes f into b and returns FinLen. It does not allocate.
func (f *FIN) Encode(b []byte) (int, error) {
	if c := f.validate(); !c.ok() {
		return 0, c.enc()
	}
	if len(b) < FinLen {
		return 0, &EncodeError{ReasonShort, "buffer"}
	}
	var fl Flags
	if f.Half {
		fl = FINHalf
	}
	putHeader(b, TypeFIN, fl, FinLen)
	binary.BigEndian.PutUint32(b[8:], f.Tag)
	binary.BigEndian.PutUint32(b[12:], f.SenderTag)
	return FinLen, nil
}

// DecodeFIN decodes a FIN frame, which has no padding: len(b) must be FinLen.
func DecodeFIN(b []byte, f *FIN) error {
	h, err := DecodeHeader(b, TypeFIN)
	if err != nil {
		return err
	}
	if h.Flags&^FINHalf != 0 {
		return decErr(ReasonFlags, "flags")
	}
	*f = FIN{Tag: binary.BigEndian.Uint32(b[8:]), SenderTag: binary.BigEndian.Uint32(b[12:]), Half: h.Flags == FINHalf}
	return f.validate().dec()
}

func validMessage(n uint32) bool { return n >= MinMessage && n <= MaxMessage }
