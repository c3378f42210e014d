package wire

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"regexp"
	"testing"

	"github.com/goxrc/goxrc/internal/fuzzpick"
)

// Completeness and exact refusal. The decode fuzzers check that what a
// decoder takes meets the spec oracle (spec_test.go), and the encode fuzzers
// that what encodes survives the round trip; neither would notice an encoder
// that refused a value the document allows (an over-strict validate, which
// Encode and Decode share). Here every value is written out by the documented
// layout (layout*, without the codec), and Encode must succeed exactly when
// the oracle takes those bytes, produce exactly them, and decode them back
// equal; the *Complete fuzzers build only values the document allows, from
// any fuzz input, so each must encode.

// layout writes a message field by field, big-endian, as the table in
// docs/xrc-protocol.md lays it out. fits turns false when a value is wider
// than its field: such a value has no encoding at all.
type layout struct {
	b    []byte
	fits bool
}

func (l *layout) put(width int, v uint64) {
	if width < 8 && v>>(8*width) != 0 {
		l.fits = false
	}
	for i := width - 1; i >= 0; i-- {
		l.b = append(l.b, byte(v>>(8*i)))
	}
}

func (l *layout) header(version, typ byte, flags Flags) {
	l.b, l.fits = append(l.b[:0], 0x58, 0x52, version, typ, byte(flags), 0, 0, 0), true
}

// done sets the header's length and returns the message and whether it is
// representable.
func (l *layout) done() ([]byte, bool) {
	n := len(l.b)
	if n > math.MaxUint16 {
		return nil, false
	}
	l.b[6], l.b[7] = byte(n>>8), byte(n)
	return l.b, l.fits
}

func layoutReq(r *Req) ([]byte, bool) {
	if r.Type != TypePhysReq && r.Type != TypeVirtReq {
		return nil, false
	}
	var l layout
	l.header(4, byte(r.Type), r.Flags)
	l.put(4, uint64(r.ConnTag))
	l.put(4, uint64(r.PeerTag))
	l.put(8, r.Incarnation)
	l.put(3, uint64(r.INIQPN))
	l.put(3, uint64(r.TGTQPNHint))
	l.put(8, r.DomainHint)
	l.put(3, uint64(r.SRQN))
	l.put(2, uint64(r.ReplyPort))
	l.put(2, uint64(r.Credits))
	l.put(4, uint64(r.MaxMessage))
	l.put(4, uint64(r.Move))
	l.put(1, uint64(len(r.App())))
	l.b = append(l.b, r.App()...)
	return l.done()
}

func layoutAccept(a *Accept) ([]byte, bool) {
	var l layout
	l.header(4, 3, a.Flags)
	l.put(4, uint64(a.TagEcho))
	l.put(4, uint64(a.AcceptorTag))
	l.put(8, a.Incarnation)
	l.put(3, uint64(a.TGTQPN))
	l.put(3, uint64(a.SRQN))
	l.put(8, a.DomainID)
	l.put(2, uint64(a.Credits))
	l.put(4, uint64(a.MaxMessage))
	l.put(1, uint64(len(a.App())))
	if a.Flags&8 != 0 {
		l.put(4, uint64(a.Rev.Tag))
		l.put(3, uint64(a.Rev.INIQPN))
		l.put(3, uint64(a.Rev.TGTQPN))
		l.put(8, a.Rev.DomainID)
	} else if a.Rev != (Reverse{}) {
		l.fits = false // the section is on the wire only with REVERSE
	}
	l.b = append(l.b, a.App()...)
	return l.done()
}

func layoutReject(r *Reject) ([]byte, bool) {
	var l layout
	l.header(1, 4, 0) // "it always carries version 1 in its header"
	l.put(4, uint64(r.Tag))
	l.put(1, uint64(r.Reason))
	l.put(1, uint64(r.MinVersion))
	l.put(1, uint64(r.MaxVersion))
	l.put(1, 0)
	l.put(4, uint64(r.Detail))
	l.put(8, r.DomainID)
	l.put(1, uint64(len(r.App())))
	l.b = append(l.b, r.App()...)
	return l.done()
}

func layoutFIN(f *FIN) ([]byte, bool) {
	var l layout
	var fl Flags
	if f.Half {
		fl = 1
	}
	l.header(4, 5, fl)
	l.put(4, uint64(f.Tag))
	l.put(4, uint64(f.SenderTag))
	return l.done()
}

// padded is b as the kernel delivers it in a carrier of size bytes.
func padded(b []byte, size int) []byte {
	return append(bytes.Clone(b), make([]byte, max(0, size-len(b)))...)
}

// encoder is what each message type has in common for checkExact.
type encoder interface {
	Encode([]byte) (int, error)
}

// checkExact encodes v and holds the result against the document: it must
// succeed exactly when v is representable and the oracle takes its layout
// in the carrier (oracle(padded layout)); then it must write exactly the
// layout, and decode (run on the encoding in each carrier size) must give
// v back. It returns whether v encoded.
func checkExact[T comparable](t *testing.T, v *T, enc encoder, lay func() ([]byte, bool),
	oracle func([]byte) error, carriers []int, decode func([]byte, *T) error) bool {
	t.Helper()
	want, repr := lay()
	var rule error = errors.New("not representable")
	if repr {
		rule = oracle(padded(want, carriers[0]))
	}
	buf := make([]byte, 512)
	for i := range buf {
		buf[i] = 0xEE // Encode writes n bytes; what lies beyond is not its business
	}
	n, err := enc.Encode(buf)
	switch {
	case err == nil && rule != nil:
		t.Fatalf("%s encoded, against the document: %v", show(v), rule)
	case err != nil && rule == nil:
		t.Fatalf("%s is valid by the document, yet Encode refused it: %v", show(v), err)
	case err != nil:
		var ee *EncodeError
		if !errors.As(err, &ee) {
			t.Fatalf("%s refused with %v (a %T), not an *EncodeError", show(v), err, err)
		}
		return false
	}
	if !bytes.Equal(buf[:n], want) {
		t.Fatalf("%s: encoding is not the documented layout\n got %x\nwant %x", show(v), buf[:n], want)
	}
	for _, size := range append([]int{n}, carriers...) {
		var got T
		if err := decode(padded(buf[:n], size), &got); err != nil || got != *v {
			t.Fatalf("%s: decoded from %d bytes as %s: %v", show(v), size, show(&got), err)
		}
	}
	return true
}

// show prints a message without its app-data array (App shows the part
// in use: the app length does).
func show[T any](v *T) string {
	return appArray.ReplaceAllString(fmt.Sprintf("%+v", *v), "")
}

var appArray = regexp.MustCompile(` app:\[[0-9 ]*\]`)

func exactReq(t *testing.T, r Req) bool {
	t.Helper()
	carrier := BudgetREQ
	if r.Type == TypeVirtReq {
		carrier = BudgetSIDRREQ
	}
	return checkExact(t, &r, &r, func() ([]byte, bool) { return layoutReq(&r) },
		func(b []byte) error { return specReq(b, r.Type, nil) }, []int{carrier},
		func(b []byte, got *Req) error { return DecodeReq(b, r.Type, got) })
}

func exactAccept(t *testing.T, a Accept) bool {
	t.Helper()
	return checkExact(t, &a, &a, func() ([]byte, bool) { return layoutAccept(&a) },
		func(b []byte) error { return specAccept(b, nil) }, []int{BudgetSIDRREP, BudgetREP}, DecodeAccept)
}

func exactReject(t *testing.T, r Reject) bool {
	t.Helper()
	return checkExact(t, &r, &r, func() ([]byte, bool) { return layoutReject(&r) },
		func(b []byte) error { return specReject(b, nil) }, []int{BudgetSIDRREP, BudgetREJ}, DecodeReject)
}

func exactFIN(t *testing.T, f FIN) bool {
	t.Helper()
	return checkExact(t, &f, &f, func() ([]byte, bool) { return layoutFIN(&f) },
		func(b []byte) error { return specFIN(b, nil) }, []int{FinLen}, DecodeFIN)
}

const u24, u32, u64 = 1<<24 - 1, math.MaxUint32, math.MaxUint64

// The REQ flag sets the document allows: any of RECIPROCAL, REPLACES_TGT
// and MOVE on a PHYS_REQ; on a VIRT_REQ no REPLACES_TGT ("only PHYS may
// carry it"), ONE_EXCHANGE neither with RECIPROCAL nor with MOVE, and
// ABORT with RECIPROCAL alone.
var (
	physFlags = []Flags{0, 1, 2, 4, 1 | 2, 1 | 4, 2 | 4, 1 | 2 | 4}
	virtFlags = []Flags{0, 1, 4, 1 | 4, 8, 1 | 16}
)

// validReq builds a REQ the document allows from any inputs.
func validReq(sel uint8, tag, peer uint32, inc uint64, ini, hint uint32, dom uint64, srqn uint32,
	port, credits uint16, maxMsg, move uint32, app []byte) Req {
	r := Req{Type: TypePhysReq, Flags: physFlags[int(sel>>1)%len(physFlags)]}
	maxApp := BudgetREQ - 54
	if sel&1 != 0 {
		r.Type, r.Flags, maxApp = TypeVirtReq, virtFlags[int(sel>>1)%len(virtFlags)], BudgetSIDRREQ-54
	}
	r.ConnTag = uint32(fuzzpick.Pick(uint64(tag), 1, u32))
	if r.Flags&(1|8) != 0 { // a peer tag exactly with RECIPROCAL or ONE_EXCHANGE
		r.PeerTag = uint32(fuzzpick.Pick(uint64(peer), 1, u32))
	}
	r.Incarnation = fuzzpick.Pick(inc, 1, u64)
	r.INIQPN = uint32(fuzzpick.Pick(uint64(ini), 2, u24))
	if r.Type == TypeVirtReq || r.Flags&2 != 0 { // VIRT and REPLACES_TGT need a hint
		r.TGTQPNHint = uint32(fuzzpick.Pick(uint64(hint), 2, u24))
	}
	r.DomainHint = fuzzpick.Pick(dom, 0, u64)
	if r.Type == TypeVirtReq {
		r.DomainHint = fuzzpick.Pick(dom, 1, u64)
	}
	if r.Flags&16 != 0 { // ABORT names no QP and no domain
		r.INIQPN, r.TGTQPNHint, r.DomainHint = 0, 0, 0
	}
	r.SRQN = uint32(fuzzpick.Pick(uint64(srqn), 0, u24))
	r.ReplyPort = uint16(fuzzpick.Pick(uint64(port), 1, math.MaxUint16))
	r.Credits = uint16(fuzzpick.Pick(uint64(credits), 1, math.MaxUint16))
	r.MaxMessage = uint32(fuzzpick.Pick(uint64(maxMsg), 64, 1<<20))
	if r.Flags&4 != 0 { // a move generation exactly with MOVE
		r.Move = uint32(fuzzpick.Pick(uint64(move), 1, u32))
	}
	if err := r.SetApp(app[:min(len(app), maxApp)]); err != nil {
		panic(err)
	}
	return r
}

// FuzzReqComplete: every REQ the document allows encodes, as the documented
// layout, and decodes back equal (completeness).
func FuzzReqComplete(f *testing.F) {
	for sel := range uint8(16) {
		f.Add(sel, uint32(0), uint32(0), uint64(0), uint32(0), uint32(0), uint64(0), uint32(0), uint16(0), uint16(0), uint32(0), uint32(0), []byte{})
		f.Add(sel, uint32(3), uint32(3), uint64(3), uint32(3), uint32(3), uint64(3), uint32(3), uint16(3), uint16(3), uint32(3), uint32(3), make([]byte, 200))
	}
	f.Fuzz(func(t *testing.T, sel uint8, tag, peer uint32, inc uint64, ini, hint uint32, dom uint64, srqn uint32,
		port, credits uint16, maxMsg, move uint32, app []byte) {
		r := validReq(sel, tag, peer, inc, ini, hint, dom, srqn, port, credits, maxMsg, move, app)
		if !exactReq(t, r) {
			t.Fatal("unreachable: exactReq fails first")
		}
	})
}

func validAccept(rev bool, echo, atag uint32, inc uint64, tgt, srqn uint32, dom uint64, credits uint16, maxMsg uint32,
	rtag, rini, rtgt uint32, rdom uint64, app []byte) Accept {
	a := Accept{TagEcho: uint32(fuzzpick.Pick(uint64(echo), 1, u32)), AcceptorTag: uint32(fuzzpick.Pick(uint64(atag), 1, u32)),
		Incarnation: fuzzpick.Pick(inc, 1, u64), TGTQPN: uint32(fuzzpick.Pick(uint64(tgt), 2, u24)), SRQN: uint32(fuzzpick.Pick(uint64(srqn), 0, u24)),
		DomainID: fuzzpick.Pick(dom, 1, u64), Credits: uint16(fuzzpick.Pick(uint64(credits), 1, math.MaxUint16)),
		MaxMessage: uint32(fuzzpick.Pick(uint64(maxMsg), 64, 1<<20))}
	maxApp := 136 - 45
	if rev { // "the whole still within 136 bytes (app data <= 73)"
		a.Flags, maxApp = 8, 136-63
		a.Rev = Reverse{Tag: uint32(fuzzpick.Pick(uint64(rtag), 1, u32)), INIQPN: uint32(fuzzpick.Pick(uint64(rini), 2, u24)),
			TGTQPN: uint32(fuzzpick.Pick(uint64(rtgt), 2, u24)), DomainID: fuzzpick.Pick(rdom, 1, u64)}
	}
	if err := a.SetApp(app[:min(len(app), maxApp)]); err != nil {
		panic(err)
	}
	return a
}

// FuzzAcceptComplete: every ACCEPT the document allows, with or without
// the REVERSE section, encodes and decodes back equal, in a SIDR REP and in
// a REP.
func FuzzAcceptComplete(f *testing.F) {
	for _, rev := range []bool{false, true} {
		f.Add(rev, uint32(0), uint32(0), uint64(0), uint32(0), uint32(0), uint64(0), uint16(0), uint32(0), uint32(0), uint32(0), uint32(0), uint64(0), []byte{})
		f.Add(rev, uint32(3), uint32(3), uint64(3), uint32(3), uint32(3), uint64(3), uint16(3), uint32(3), uint32(3), uint32(3), uint32(3), uint64(3), make([]byte, 200))
	}
	f.Fuzz(func(t *testing.T, rev bool, echo, atag uint32, inc uint64, tgt, srqn uint32, dom uint64, credits uint16, maxMsg uint32,
		rtag, rini, rtgt uint32, rdom uint64, app []byte) {
		a := validAccept(rev, echo, atag, inc, tgt, srqn, dom, credits, maxMsg, rtag, rini, rtgt, rdom, app)
		exactAccept(t, a)
	})
}

func validReject(tag uint32, reason, lo, hi uint8, detail uint32, dom uint64, app []byte) Reject {
	r := Reject{Tag: tag, Reason: RejectReason(fuzzpick.Pick(uint64(reason), 1, 7)), Detail: detail, DomainID: dom}
	r.MinVersion = uint8(fuzzpick.Pick(uint64(lo), 1, 255))
	r.MaxVersion = uint8(fuzzpick.Pick(uint64(hi), uint64(r.MinVersion), 255))
	if r.Reason == RejectDomainMismatch { // "carries the rejecter's domain id"
		r.DomainID = fuzzpick.Pick(dom, 1, u64)
	}
	if err := r.SetApp(app[:min(len(app), 136-29)]); err != nil {
		panic(err)
	}
	return r
}

// FuzzRejectComplete: every REJECT the document allows (any tag, 0 for an
// unreadable REQ; any detail) encodes and decodes back equal, in a SIDR REP
// and in a REJ.
func FuzzRejectComplete(f *testing.F) {
	for reason := range uint8(8) {
		f.Add(uint32(0), reason, uint8(0), uint8(0), uint32(0), uint64(0), []byte{})
		f.Add(uint32(3), reason, uint8(3), uint8(3), uint32(3), uint64(3), make([]byte, 200))
	}
	f.Fuzz(func(t *testing.T, tag uint32, reason, lo, hi uint8, detail uint32, dom uint64, app []byte) {
		exactReject(t, validReject(tag, reason, lo, hi, detail, dom, app))
	})
}

// FuzzFINComplete: every FIN (non-zero tags, HALF or not) encodes and
// decodes back equal.
func FuzzFINComplete(f *testing.F) {
	f.Add(uint32(0), uint32(0), false)
	f.Add(uint32(3), uint32(2), true)
	f.Fuzz(func(t *testing.T, tag, sender uint32, half bool) {
		exactFIN(t, FIN{Tag: uint32(fuzzpick.Pick(uint64(tag), 1, u32)), SenderTag: uint32(fuzzpick.Pick(uint64(sender), 1, u32)), Half: half})
	})
}

// edges returns values around the bounds lo and hi of a field (those the
// field's Go type can hold): lo-1, lo, lo+1, hi-1, hi, hi+1.
func edges(lo, hi, typeMax uint64) []uint64 {
	var out []uint64
	for _, v := range []uint64{lo - 1, lo, lo + 1, hi - 1, hi, hi + 1} {
		if v <= typeMax && (v != lo-1 || lo > 0) && (v != hi+1 || hi < typeMax) {
			out = append(out, v)
		}
	}
	return out
}

// TestEncodeBoundaries: Encode takes exactly what the document allows at
// every bound of every ranged field, and for every flag byte with every
// combination of the fields the flags govern, each message type.
func TestEncodeBoundaries(t *testing.T) {
	count := [2]int{}
	tally := func(ok bool) {
		if ok {
			count[1]++
		} else {
			count[0]++
		}
	}
	// REQ: each ranged field at its bounds, from each edge message.
	for _, base := range edgeReqs() {
		set := func(f func(r *Req, v uint64), lo, hi, typeMax uint64) {
			for _, v := range edges(lo, hi, typeMax) {
				r := base
				f(&r, v)
				tally(exactReq(t, r))
			}
		}
		set(func(r *Req, v uint64) { r.ConnTag = uint32(v) }, 1, u32, u32)
		set(func(r *Req, v uint64) { r.Incarnation = v }, 1, u64, u64)
		set(func(r *Req, v uint64) { r.INIQPN = uint32(v) }, 2, u24, u32)
		set(func(r *Req, v uint64) { r.TGTQPNHint = uint32(v) }, 2, u24, u32)
		set(func(r *Req, v uint64) { r.DomainHint = v }, 1, u64, u64)
		set(func(r *Req, v uint64) { r.SRQN = uint32(v) }, 0, u24, u32)
		set(func(r *Req, v uint64) { r.ReplyPort = uint16(v) }, 1, math.MaxUint16, math.MaxUint16)
		set(func(r *Req, v uint64) { r.Credits = uint16(v) }, 1, math.MaxUint16, math.MaxUint16)
		set(func(r *Req, v uint64) { r.MaxMessage = uint32(v) }, 64, 1<<20, u32)
		set(func(r *Req, v uint64) { r.Move = uint32(v) }, 1, u32, u32)
		set(func(r *Req, v uint64) { r.PeerTag = uint32(v) }, 1, u32, u32)
		set(func(r *Req, v uint64) { r.SetApp(make([]byte, v)) }, 0, uint64(MaxPhysReqApp), uint64(MaxVirtReqApp))
		set(func(r *Req, v uint64) { r.SetApp(make([]byte, v)) }, 0, uint64(MaxVirtReqApp), uint64(MaxVirtReqApp))
		set(func(r *Req, v uint64) { r.Type = Type(v) }, 1, 2, 255)
	}
	// REQ: every flag byte, both types, with the fields the flags govern
	// (peer tag, move generation, INI QPN, TGT hint, domain hint) zero or
	// not.
	for _, typ := range []Type{TypePhysReq, TypeVirtReq} {
		for fl := range 256 {
			for _, peer := range []uint32{0, 1} {
				for _, move := range []uint32{0, 1} {
					for _, ini := range []uint32{0, 2} {
						for _, hint := range []uint32{0, 1, 2} {
							for _, dom := range []uint64{0, 1} {
								r := Req{Type: typ, Flags: Flags(fl), ConnTag: 1, PeerTag: peer, Incarnation: 1, INIQPN: ini,
									TGTQPNHint: hint, DomainHint: dom, ReplyPort: 1, Credits: 1, MaxMessage: 64, Move: move}
								tally(exactReq(t, r))
							}
						}
					}
				}
			}
		}
	}
	// ACCEPT: ranged fields from each edge message, then every flag byte
	// with the section valid, zero or one of its fields out of range,
	// and the app data at the bounds of both layouts.
	for _, base := range edgeAccepts() {
		set := func(f func(a *Accept, v uint64), lo, hi, typeMax uint64) {
			for _, v := range edges(lo, hi, typeMax) {
				a := base
				f(&a, v)
				tally(exactAccept(t, a))
			}
		}
		set(func(a *Accept, v uint64) { a.TagEcho = uint32(v) }, 1, u32, u32)
		set(func(a *Accept, v uint64) { a.AcceptorTag = uint32(v) }, 1, u32, u32)
		set(func(a *Accept, v uint64) { a.Incarnation = v }, 1, u64, u64)
		set(func(a *Accept, v uint64) { a.TGTQPN = uint32(v) }, 2, u24, u32)
		set(func(a *Accept, v uint64) { a.SRQN = uint32(v) }, 0, u24, u32)
		set(func(a *Accept, v uint64) { a.DomainID = v }, 1, u64, u64)
		set(func(a *Accept, v uint64) { a.Credits = uint16(v) }, 1, math.MaxUint16, math.MaxUint16)
		set(func(a *Accept, v uint64) { a.MaxMessage = uint32(v) }, 64, 1<<20, u32)
		set(func(a *Accept, v uint64) { a.SetApp(make([]byte, v)) }, 0, 136-63, uint64(MaxAcceptApp))
		set(func(a *Accept, v uint64) { a.SetApp(make([]byte, v)) }, 0, 136-45, uint64(MaxAcceptApp))
		set(func(a *Accept, v uint64) { a.Rev.Tag = uint32(v) }, 1, u32, u32)
		set(func(a *Accept, v uint64) { a.Rev.INIQPN = uint32(v) }, 2, u24, u32)
		set(func(a *Accept, v uint64) { a.Rev.TGTQPN = uint32(v) }, 2, u24, u32)
		set(func(a *Accept, v uint64) { a.Rev.DomainID = v }, 1, u64, u64)
	}
	good := Reverse{Tag: 1, INIQPN: 2, TGTQPN: 2, DomainID: 1}
	revs := []Reverse{{}, good, {INIQPN: 2, TGTQPN: 2, DomainID: 1}, {Tag: 1, INIQPN: 1, TGTQPN: 2, DomainID: 1},
		{Tag: 1, INIQPN: 2, TGTQPN: 1, DomainID: 1}, {Tag: 1, INIQPN: 2, TGTQPN: 2}, {Tag: 1, INIQPN: 1 << 24, TGTQPN: 2, DomainID: 1}}
	for fl := range 256 {
		for _, rev := range revs {
			for _, app := range []int{0, 136 - 63, 136 - 63 + 1, MaxAcceptApp} {
				a := Accept{Flags: Flags(fl), TagEcho: 1, AcceptorTag: 1, Incarnation: 1, TGTQPN: 2, DomainID: 1, Credits: 1, MaxMessage: 64, Rev: rev}
				a.SetApp(make([]byte, app))
				tally(exactAccept(t, a))
			}
		}
	}
	// REJECT: every reason with version ranges and a domain id at the
	// bounds, the app data at its bounds, any tag and detail.
	for reason := range 256 {
		for _, lo := range []uint8{0, 1, 2, 255} {
			for _, hi := range []uint8{0, 1, 2, 255} {
				for _, dom := range []uint64{0, 1, u64} {
					r := Reject{Reason: RejectReason(reason), MinVersion: lo, MaxVersion: hi, DomainID: dom}
					tally(exactReject(t, r))
				}
			}
		}
	}
	for _, app := range []int{0, 1, MaxRejectApp} {
		for _, tag := range []uint32{0, 1, u32} {
			r := Reject{Tag: tag, Reason: RejectApp, MinVersion: 3, MaxVersion: 3, Detail: u32}
			r.SetApp(make([]byte, app))
			tally(exactReject(t, r))
		}
	}
	// FIN: both tags at their bounds, HALF or not.
	for _, tag := range []uint32{0, 1, u32} {
		for _, sender := range []uint32{0, 1, u32} {
			for _, half := range []bool{false, true} {
				tally(exactFIN(t, FIN{Tag: tag, SenderTag: sender, Half: half}))
			}
		}
	}
	t.Logf("%d values encoded, %d refused, each as the document says", count[1], count[0])
	if count[0] == 0 || count[1] == 0 {
		t.Fatal("the boundary values do not reach both sides")
	}
}
