package wire

import (
	"bytes"
	"errors"
	"testing"
)

func sampleReq(t Type) Req {
	r := Req{Type: t, ConnTag: 0xA1B2C3D4, Incarnation: 0x0102030405060708, INIQPN: 0x123456,
		SRQN: 0xABCDEF, ReplyPort: 20002, Credits: 0x0102, MaxMessage: 0x10000}
	if t == TypeVirtReq {
		r.TGTQPNHint = 0x654321
		r.DomainHint = 0xDEADBEEFCAFEF00D
	}
	return r
}

func TestReqRoundTripAndLayout(t *testing.T) {
	r := sampleReq(TypePhysReq)
	r.Flags, r.Move = FlagMove, 0x0A0B0C0D
	if err := r.SetApp([]byte("hi")); err != nil {
		t.Fatal(err)
	}
	var buf [BudgetREQ]byte
	n, err := r.Encode(buf[:])
	if err != nil {
		t.Fatal(err)
	}
	want := []byte{0x58, 0x52, 4, 1, 4, 0, 0, 56,
		0xA1, 0xB2, 0xC3, 0xD4, 0, 0, 0, 0,
		1, 2, 3, 4, 5, 6, 7, 8,
		0x12, 0x34, 0x56, 0, 0, 0,
		0, 0, 0, 0, 0, 0, 0, 0,
		0xAB, 0xCD, 0xEF, 0x4E, 0x22, 1, 2, 0, 1, 0, 0,
		0x0A, 0x0B, 0x0C, 0x0D, 2, 'h', 'i'}
	if !bytes.Equal(buf[:n], want) {
		t.Fatalf("layout\n got %x\nwant %x", buf[:n], want)
	}
	// The kernel pads to the budget with zeros: decode must ignore that.
	var got Req
	if err := DecodeReq(buf[:], TypePhysReq, &got); err != nil {
		t.Fatal(err)
	}
	if got != r {
		t.Fatalf("round trip: %+v != %+v", got, r)
	}
	// Exact length works too.
	if err := DecodeReq(buf[:n], TypePhysReq, &got); err != nil || got != r {
		t.Fatalf("exact: %v", err)
	}
}

func TestBudgets(t *testing.T) {
	var buf [256]byte
	phys := sampleReq(TypePhysReq)
	if err := phys.SetApp(make([]byte, MaxPhysReqApp)); err != nil {
		t.Fatal(err)
	}
	if n, err := phys.Encode(buf[:]); err != nil || n != BudgetREQ {
		t.Fatalf("PHYS_REQ full: n=%d err=%v", n, err)
	}
	phys.SetApp(make([]byte, MaxPhysReqApp+1))
	if _, err := phys.Encode(buf[:]); !isEnc(err, ReasonAppLength) {
		t.Fatalf("PHYS_REQ over budget: %v", err)
	}
	virt := sampleReq(TypeVirtReq)
	virt.SetApp(make([]byte, MaxVirtReqApp))
	if n, err := virt.Encode(buf[:]); err != nil || n != BudgetSIDRREQ {
		t.Fatalf("VIRT_REQ full: n=%d err=%v", n, err)
	}
	if err := virt.SetApp(make([]byte, MaxVirtReqApp+1)); err == nil {
		t.Fatal("VIRT_REQ app over array accepted")
	}
	a := sampleAccept()
	a.SetApp(make([]byte, MaxAcceptApp))
	if n, err := a.Encode(buf[:]); err != nil || n != BudgetSIDRREP {
		t.Fatalf("ACCEPT full: n=%d err=%v", n, err)
	}
	rj := Reject{Reason: RejectApp, MinVersion: 1, MaxVersion: 1}
	rj.SetApp(make([]byte, MaxRejectApp))
	if n, err := rj.Encode(buf[:]); err != nil || n != BudgetSIDRREP {
		t.Fatalf("REJECT full: n=%d err=%v", n, err)
	}
	// Short buffer.
	if _, err := rj.Encode(buf[:10]); !isEnc(err, ReasonShort) {
		t.Fatalf("short buffer: %v", err)
	}
}

func sampleAccept() Accept {
	return Accept{TagEcho: 7, AcceptorTag: 9, Incarnation: 11, TGTQPN: 0x22, SRQN: 0x33, DomainID: 0x44, Credits: 16, MaxMessage: MaxMessage}
}

func TestAcceptFromREPAndSIDRREP(t *testing.T) {
	a := sampleAccept()
	a.SetApp([]byte{1, 2, 3})
	for _, budget := range []int{BudgetREP, BudgetSIDRREP} {
		buf := make([]byte, budget)
		if _, err := a.Encode(buf); err != nil {
			t.Fatal(err)
		}
		var got Accept
		if err := DecodeAccept(buf, &got); err != nil || got != a {
			t.Fatalf("budget %d: %v %+v", budget, err, got)
		}
	}
	// Longer than any carrier.
	buf := make([]byte, BudgetREP+1)
	a.Encode(buf)
	var got Accept
	if err := DecodeAccept(buf, &got); !isDec(err, ReasonTooLong) {
		t.Fatalf("over REP budget: %v", err)
	}
}

func sampleReverseAccept() Accept {
	a := sampleAccept()
	a.Flags = AcceptReverse
	a.Rev = Reverse{Tag: 0x01020304, INIQPN: 0x0A0B0C, TGTQPN: 0x0D0E0F, DomainID: 0x1112131415161718}
	return a
}

func TestAcceptReverse(t *testing.T) {
	a := sampleReverseAccept()
	buf := make([]byte, BudgetSIDRREP)
	n, err := a.Encode(buf)
	if err != nil || n != acceptFixed+ReverseLen || buf[4] != byte(AcceptReverse) {
		t.Fatalf("encode: %d %v", n, err)
	}
	if want := []byte{1, 2, 3, 4, 0x0A, 0x0B, 0x0C, 0x0D, 0x0E, 0x0F, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18}; !bytes.Equal(buf[acceptFixed:n], want) {
		t.Fatalf("layout % x", buf[acceptFixed:n])
	}
	var got Accept
	if err := DecodeAccept(buf, &got); err != nil || got != a {
		t.Fatalf("round trip: %v %+v", err, got)
	}
	// The app data shrinks by the section: the whole still fits a SIDR REP.
	if err := a.SetApp(make([]byte, BudgetSIDRREP-acceptFixed-ReverseLen)); err != nil {
		t.Fatal(err)
	}
	if n, err := a.Encode(buf); err != nil || n != BudgetSIDRREP {
		t.Fatalf("full: %d %v", n, err)
	}
	a.SetApp(make([]byte, BudgetSIDRREP-acceptFixed-ReverseLen+1))
	if _, err := a.Encode(buf); err == nil {
		t.Fatal("over the SIDR REP budget encoded")
	}
	// Strictness.
	bads := map[string]func(*Accept){
		"unknown flag":     func(a *Accept) { a.Flags |= 1 },
		"rev no flag":      func(a *Accept) { a.Flags = 0 },
		"zero rev tag":     func(a *Accept) { a.Rev.Tag = 0 },
		"rev INI QP1":      func(a *Accept) { a.Rev.INIQPN = 1 },
		"rev TGT 0":        func(a *Accept) { a.Rev.TGTQPN = 0 },
		"rev TGT 25 bit":   func(a *Accept) { a.Rev.TGTQPN = 1 << 24 },
		"rev domain 0":     func(a *Accept) { a.Rev.DomainID = 0 },
		"credits 0":        func(a *Accept) { a.Credits = 0 },
		"max message 63":   func(a *Accept) { a.MaxMessage = MinMessage - 1 },
		"max message 1M+1": func(a *Accept) { a.MaxMessage = MaxMessage + 1 },
	}
	for name, mod := range bads {
		x := sampleReverseAccept()
		mod(&x)
		if _, err := x.Encode(buf); err == nil {
			t.Errorf("%s: encoded", name)
		}
	}
	// Decoding: flag set but the declared length has no section; the
	// section present without the flag (read as app data of wrong length).
	good := sampleReverseAccept()
	n, _ = good.Encode(buf)
	b := bytes.Clone(buf)
	b[4] = 0
	if err := DecodeAccept(b, &got); err == nil {
		t.Error("section without flag decoded")
	}
	b = bytes.Clone(buf)
	b[7] = acceptFixed
	clear(b[acceptFixed:n])
	if err := DecodeAccept(b, &got); err == nil {
		t.Error("flag without section decoded")
	}
	b = bytes.Clone(buf)
	b[4] |= 0x10
	if err := DecodeAccept(b, &got); !isDec(err, ReasonFlags) {
		t.Errorf("unknown ACCEPT flag: %v", err)
	}
	b = bytes.Clone(buf)
	clear(b[38:40])
	if err := DecodeAccept(b, &got); !isDec(err, ReasonField) {
		t.Errorf("ACCEPT with no credits: %v", err)
	}
}

func TestOneExchangeReqRules(t *testing.T) {
	b := make([]byte, BudgetSIDRREQ)
	r := sampleReq(TypeVirtReq)
	r.Flags, r.PeerTag = FlagOneExchange, 77
	if _, err := r.Encode(b); err != nil {
		t.Fatal(err)
	}
	var got Req
	if err := DecodeReq(b, TypeVirtReq, &got); err != nil || got != r {
		t.Fatalf("round trip %v", err)
	}
	for name, mod := range map[string]func(*Req){
		"no peer tag":   func(r *Req) { r.PeerTag = 0 },
		"with RECIPROC": func(r *Req) { r.Flags |= FlagReciprocal },
		"with MOVE":     func(r *Req) { r.Flags |= FlagMove },
		"on PHYS_REQ":   func(r *Req) { r.Type, r.TGTQPNHint, r.DomainHint = TypePhysReq, 0, 0 },
	} {
		x := r
		mod(&x)
		if _, err := x.Encode(b); err == nil {
			t.Errorf("%s: encoded", name)
		}
	}
}

func TestRejectRoundTrip(t *testing.T) {
	r := Reject{Tag: 5, Reason: RejectDomainMismatch, MinVersion: 1, MaxVersion: 1, Detail: 77, DomainID: 0x99}
	buf := make([]byte, BudgetREJ)
	if _, err := r.Encode(buf); err != nil {
		t.Fatal(err)
	}
	var got Reject
	if err := DecodeReject(buf, &got); err != nil || got != r {
		t.Fatalf("%v %+v", err, got)
	}
	r.DomainID = 0
	if _, err := r.Encode(buf); !isEnc(err, ReasonField) {
		t.Fatalf("DOMAIN_MISMATCH without domain: %v", err)
	}
}

func TestFINRoundTrip(t *testing.T) {
	f := FIN{Tag: 1, SenderTag: 2}
	var buf [FinLen]byte
	if n, err := f.Encode(buf[:]); err != nil || n != FinLen {
		t.Fatal(n, err)
	}
	var got FIN
	if err := DecodeFIN(buf[:], &got); err != nil || got != f {
		t.Fatal(err, got)
	}
	if err := DecodeFIN(append(buf[:], 0), &got); !isDec(err, ReasonTooLong) {
		t.Fatalf("padded FIN: %v", err)
	}
	half := FIN{Tag: 1, SenderTag: 2, Half: true}
	if _, err := half.Encode(buf[:]); err != nil || buf[4] != byte(FINHalf) {
		t.Fatal(err, buf)
	}
	if err := DecodeFIN(buf[:], &got); err != nil || got != half {
		t.Fatal(err, got)
	}
	buf[4] = byte(FINHalf << 1)
	if err := DecodeFIN(buf[:], &got); !isDec(err, ReasonFlags) {
		t.Fatalf("FIN with an unknown flag: %v", err)
	}
}

// TestDecodeRejects walks the validation rules one by one, starting from a
// valid padded VIRT_REQ and breaking one thing.
func TestDecodeRejects(t *testing.T) {
	base := func() []byte {
		r := sampleReq(TypeVirtReq)
		r.SetApp([]byte("ab"))
		b := make([]byte, BudgetSIDRREQ)
		if _, err := r.Encode(b); err != nil {
			t.Fatal(err)
		}
		return b
	}
	cases := []struct {
		name   string
		mutate func([]byte) []byte
		reason Reason
		reject RejectReason
	}{
		{"empty", func(b []byte) []byte { return nil }, ReasonShort, RejectBadRequest},
		{"all zero (kernel reject)", func(b []byte) []byte { return make([]byte, len(b)) }, ReasonMagic, RejectBadRequest},
		{"magic", func(b []byte) []byte { b[0] ^= 1; return b }, ReasonMagic, RejectBadRequest},
		{"version 1", func(b []byte) []byte { b[2] = 1; return b }, ReasonVersion, RejectVersion},
		{"version 3 (the last)", func(b []byte) []byte { b[2] = 3; return b }, ReasonVersion, RejectVersion},
		{"next version short", func(b []byte) []byte { b[2] = Version + 1; return b[:4] }, ReasonVersion, RejectVersion},
		{"type", func(b []byte) []byte { b[3] = byte(TypePhysReq); return b }, ReasonType, RejectBadRequest},
		{"reserved", func(b []byte) []byte { b[5] = 1; return b }, ReasonReserved, RejectBadRequest},
		{"length zero", func(b []byte) []byte { b[6], b[7] = 0, 0; return b }, ReasonLength, RejectBadRequest},
		{"length under fixed", func(b []byte) []byte { b[7] = 20; return b }, ReasonLength, RejectBadRequest},
		{"length over budget", func(b []byte) []byte { b[6], b[7] = 0, 181; return b }, ReasonLength, RejectBadRequest},
		{"truncated", func(b []byte) []byte { return b[:40] }, ReasonShort, RejectBadRequest},
		{"input over budget", func(b []byte) []byte { return append(b, 0) }, ReasonTooLong, RejectBadRequest},
		{"garbage padding", func(b []byte) []byte { b[170] = 1; return b }, ReasonTrailing, RejectBadRequest},
		{"app length", func(b []byte) []byte { b[53] = 3; return b }, ReasonAppLength, RejectBadRequest},
		{"move generation without MOVE", func(b []byte) []byte { b[52] = 1; return b }, ReasonField, RejectBadRequest},
		{"MOVE without move generation", func(b []byte) []byte { b[4] |= byte(FlagMove); return b }, ReasonField, RejectBadRequest},
		{"unknown flag", func(b []byte) []byte { b[4] = 0x80; return b }, ReasonFlags, RejectBadRequest},
		{"replaces on VIRT", func(b []byte) []byte { b[4] = byte(FlagReplacesTGT); return b }, ReasonFlags, RejectBadRequest},
		{"reciprocal without peer tag", func(b []byte) []byte { b[4] = byte(FlagReciprocal); return b }, ReasonFlags, RejectBadRequest},
		{"peer tag without reciprocal", func(b []byte) []byte { b[15] = 1; return b }, ReasonFlags, RejectBadRequest},
		{"conn tag 0", func(b []byte) []byte { clear(b[8:12]); return b }, ReasonField, RejectBadRequest},
		{"incarnation 0", func(b []byte) []byte { clear(b[16:24]); return b }, ReasonField, RejectBadRequest},
		{"INI QPN 1", func(b []byte) []byte { b[24], b[25], b[26] = 0, 0, 1; return b }, ReasonField, RejectBadRequest},
		{"TGT hint 0", func(b []byte) []byte { clear(b[27:30]); return b }, ReasonField, RejectBadRequest},
		{"domain hint 0", func(b []byte) []byte { clear(b[30:38]); return b }, ReasonField, RejectBadRequest},
		{"credits 0", func(b []byte) []byte { clear(b[43:45]); return b }, ReasonField, RejectBadRequest},
		{"max message 0", func(b []byte) []byte { clear(b[45:49]); return b }, ReasonField, RejectBadRequest},
		{"max message 2 MiB", func(b []byte) []byte { b[46] = 0x20; return b }, ReasonField, RejectBadRequest},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var r Req
			err := DecodeReq(c.mutate(base()), TypeVirtReq, &r)
			var de *DecodeError
			if !errors.As(err, &de) || de.Reason != c.reason {
				t.Fatalf("got %v, want reason %v", err, c.reason)
			}
			if de.RejectReason() != c.reject {
				t.Fatalf("reject reason %v, want %v", de.RejectReason(), c.reject)
			}
		})
	}
}

func TestPhysReqFlagRules(t *testing.T) {
	var buf [BudgetREQ]byte
	r := sampleReq(TypePhysReq)
	r.TGTQPNHint = 0x50
	if _, err := r.Encode(buf[:]); !isEnc(err, ReasonField) {
		t.Fatalf("hint without REPLACES_TGT: %v", err)
	}
	r.Flags = FlagReplacesTGT | FlagReciprocal
	r.PeerTag = 3
	n, err := r.Encode(buf[:])
	if err != nil {
		t.Fatal(err)
	}
	var got Req
	if err := DecodeReq(buf[:], TypePhysReq, &got); err != nil || got != r {
		t.Fatalf("%v", err)
	}
	// A PHYS_REQ is never valid in a SIDR REQ and vice versa.
	if err := DecodeReq(buf[:n], TypeVirtReq, &got); !isDec(err, ReasonType) {
		t.Fatalf("PHYS as VIRT: %v", err)
	}
	r.Flags = FlagReplacesTGT
	r.PeerTag = 0
	r.TGTQPNHint = 0
	if _, err := r.Encode(buf[:]); !isEnc(err, ReasonField) {
		t.Fatalf("REPLACES_TGT without hint: %v", err)
	}
	r = sampleReq(TypePhysReq)
	r.INIQPN = 1 << 24
	if _, err := r.Encode(buf[:]); !isEnc(err, ReasonField) {
		t.Fatalf("25-bit QPN: %v", err)
	}
	r = sampleReq(TypePhysReq)
	r.SRQN = 1 << 24
	if _, err := r.Encode(buf[:]); !isEnc(err, ReasonField) {
		t.Fatalf("25-bit SRQN: %v", err)
	}
}

func TestEncodeZeroAllocs(t *testing.T) {
	var buf [256]byte
	r := sampleReq(TypeVirtReq)
	r.SetApp([]byte("xyz"))
	a := sampleAccept()
	rj := Reject{Reason: RejectTGTGone, MinVersion: 1, MaxVersion: 1}
	f := FIN{Tag: 1, SenderTag: 2}
	var dr Req
	var da Accept
	allocs := testing.AllocsPerRun(100, func() {
		n, _ := r.Encode(buf[:])
		_ = DecodeReq(buf[:n], TypeVirtReq, &dr)
		n, _ = a.Encode(buf[:])
		_ = DecodeAccept(buf[:n], &da)
		rj.Encode(buf[:])
		f.Encode(buf[:])
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per encode/decode", allocs)
	}
}

func isDec(err error, r Reason) bool {
	var e *DecodeError
	return errors.As(err, &e) && e.Reason == r
}

func isEnc(err error, r Reason) bool {
	var e *EncodeError
	return errors.As(err, &e) && e.Reason == r
}

// REJECT's layout is frozen as version 1 had it: it goes out with version 1
// in its header and any version's decodes, so that REJECT(VERSION) and its
// range reach a peer of another version (a strict header check made it
// unreadable to the very peer it was for).
func TestRejectReadableAcrossVersions(t *testing.T) {
	r := Reject{Reason: RejectVersion, MinVersion: MinVersion, MaxVersion: MaxVersion}
	buf := make([]byte, BudgetREJ)
	if _, err := r.Encode(buf); err != nil {
		t.Fatal(err)
	}
	if buf[2] != 1 {
		t.Fatalf("REJECT header version %d, want 1", buf[2])
	}
	for _, v := range []byte{1, 2, 3} {
		buf[2] = v
		var got Reject
		if err := DecodeReject(buf, &got); err != nil || got != r {
			t.Fatalf("REJECT with header version %d: %v %+v", v, err, got)
		}
	}
	buf[2] = 0
	var got Reject
	if err := DecodeReject(buf, &got); err == nil {
		t.Fatal("REJECT with header version 0 decoded")
	}
	// The other messages stay strict.
	req := sampleReq(TypePhysReq)
	b := make([]byte, BudgetREQ)
	if _, err := req.Encode(b); err != nil {
		t.Fatal(err)
	}
	b[2] = 1
	var r2 Req
	if err := DecodeReq(b, TypePhysReq, &r2); !isDec(err, ReasonVersion) {
		t.Fatalf("a version-1 REQ: %v, want a version error", err)
	}
}

// A REQ names the port the sender listens on: reverse legs dial it, so 0
// is refused both ways.
func TestReqReplyPortRequired(t *testing.T) {
	r := sampleReq(TypeVirtReq)
	b := make([]byte, BudgetSIDRREQ)
	if _, err := r.Encode(b); err != nil {
		t.Fatal(err)
	}
	r.ReplyPort = 0
	if _, err := r.Encode(make([]byte, BudgetSIDRREQ)); !isEnc(err, ReasonField) {
		t.Fatalf("encode with reply port 0: %v", err)
	}
	b[41], b[42] = 0, 0 // the encoded reply port
	var got Req
	if err := DecodeReq(b, TypeVirtReq, &got); !isDec(err, ReasonField) {
		t.Fatalf("decode with reply port 0: %v", err)
	}
}
