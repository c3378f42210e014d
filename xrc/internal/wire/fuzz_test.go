package wire

import (
	"bytes"
	"errors"
	"testing"
)

// The byte fuzzers check, for any input: decode never panics; it refuses
// with a DecodeError, and only what the spec oracle refuses too (an input
// the document allows, refused, is an honest peer's message lost); if it
// succeeds, the input and the decoded value meet docs/xrc-protocol.md as
// the spec oracle (spec_test.go) writes it out, independently of the codec's
// own checks, encoding the result gives back the input's declared bytes, the
// rest of the input is zero padding, and decoding that encoding gives the
// same value.

func seedReqs(f *testing.F) {
	for _, t := range []Type{TypePhysReq, TypeVirtReq} {
		r := sampleReq(t)
		r.SetApp([]byte("seed"))
		b := make([]byte, maxIn(t))
		r.Encode(b)
		f.Add(b, uint8(t))
	}
	f.Add([]byte{}, uint8(TypePhysReq))
	f.Add(make([]byte, BudgetREQ), uint8(TypePhysReq))
	seedEdgeReqs(f)
}

func FuzzDecodeReq(f *testing.F) {
	seedReqs(f)
	f.Fuzz(func(t *testing.T, b []byte, typ uint8) {
		want := TypePhysReq
		if typ&1 == 0 {
			want = TypeVirtReq
		}
		var r Req
		if err := DecodeReq(b, want, &r); err != nil {
			// The acceptor answers a refused REQ with the error's reason:
			// VERSION exactly for our magic with another version than 4
			// (a peer of another version must learn our range), else
			// BAD_REQUEST.
			var de *DecodeError
			other := len(b) >= 4 && b[0] == 0x58 && b[1] == 0x52 && b[2] != 4
			if !errors.As(err, &de) || (de.RejectReason() == RejectVersion) != other {
				t.Fatalf("%x refused with %v (a %T)", b, err, err)
			}
			refusedRightly(t, b, err, specReq(b, want, nil))
			return
		}
		if err := specReq(b, want, &r); err != nil {
			t.Fatal(err)
		}
		checkReencode(t, b, r.Encode)
		var again Req
		out := make([]byte, r.Len())
		r.Encode(out)
		if err := DecodeReq(out, want, &again); err != nil || again != r {
			t.Fatalf("decode(encode(x)) != x: %v", err)
		}
	})
}

func FuzzDecodeAccept(f *testing.F) {
	a := sampleAccept()
	a.SetApp([]byte("seed"))
	b := make([]byte, BudgetREP)
	a.Encode(b)
	f.Add(b)
	f.Add(b[:BudgetSIDRREP])
	f.Add([]byte{0x58, 0x52, 2, 3, 0, 0, 0, 45})
	r := sampleReverseAccept()
	r.SetApp([]byte("seed"))
	b = make([]byte, BudgetSIDRREP)
	r.Encode(b)
	f.Add(b)
	seedEdgeAccepts(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		var a Accept
		if err := DecodeAccept(b, &a); err != nil {
			refusedRightly(t, b, err, specAccept(b, nil))
			return
		}
		if err := specAccept(b, &a); err != nil {
			t.Fatal(err)
		}
		checkReencode(t, b, a.Encode)
		var again Accept
		out := make([]byte, a.Len())
		a.Encode(out)
		if err := DecodeAccept(out, &again); err != nil || again != a {
			t.Fatalf("decode(encode(x)) != x: %v", err)
		}
	})
}

func FuzzDecodeReject(f *testing.F) {
	r := Reject{Tag: 1, Reason: RejectDomainMismatch, MinVersion: 1, MaxVersion: 1, DomainID: 5}
	r.SetApp([]byte("seed"))
	b := make([]byte, BudgetREJ)
	r.Encode(b)
	f.Add(b)
	f.Add(make([]byte, BudgetREJ)) // what a kernel-made reject carries
	seedEdgeRejects(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		var r Reject
		if err := DecodeReject(b, &r); err != nil {
			refusedRightly(t, b, err, specReject(b, nil))
			return
		}
		if err := specReject(b, &r); err != nil {
			t.Fatal(err)
		}
		// Any version's REJECT decodes; ours carries rejectVersion.
		b = bytes.Clone(b)
		b[2] = rejectVersion
		checkReencode(t, b, r.Encode)
		var again Reject
		out := make([]byte, r.Len())
		r.Encode(out)
		if err := DecodeReject(out, &again); err != nil || again != r {
			t.Fatalf("decode(encode(x)) != x: %v", err)
		}
	})
}

func FuzzDecodeFIN(f *testing.F) {
	var b [FinLen]byte
	(&FIN{Tag: 1, SenderTag: 2}).Encode(b[:])
	f.Add(b[:])
	var h [FinLen]byte
	(&FIN{Tag: 1, SenderTag: 2, Half: true}).Encode(h[:])
	f.Add(h[:])
	var e [FinLen]byte
	(&FIN{Tag: 1, SenderTag: 1}).Encode(e[:])
	f.Add(e[:])
	f.Fuzz(func(t *testing.T, b []byte) {
		var x FIN
		if err := DecodeFIN(b, &x); err != nil {
			refusedRightly(t, b, err, specFIN(b, nil))
			return
		}
		if err := specFIN(b, &x); err != nil {
			t.Fatal(err)
		}
		checkReencode(t, b, x.Encode)
	})
}

// FuzzEncodeReq is the structured direction: any field values encode
// exactly when the document allows them (checkExact: the oracle on their
// documented layout), as that layout, and survive the round trip, also
// through kernel padding.
func FuzzEncodeReq(f *testing.F) {
	f.Add(uint8(1), uint8(0), uint32(1), uint32(0), uint64(1), uint32(2), uint32(0), uint64(0), uint32(0), uint16(0), uint16(1), uint32(64), uint32(0), []byte("a"))
	f.Add(uint8(2), uint8(1), uint32(1), uint32(9), uint64(1), uint32(2), uint32(3), uint64(4), uint32(5), uint16(6), uint16(64), uint32(1<<20), uint32(0), []byte{})
	f.Add(uint8(2), uint8(8), uint32(1), uint32(9), uint64(1), uint32(2), uint32(3), uint64(4), uint32(5), uint16(6), uint16(0), uint32(0), uint32(0), []byte{})
	f.Add(uint8(2), uint8(4), uint32(1), uint32(0), uint64(1), uint32(2), uint32(3), uint64(4), uint32(5), uint16(6), uint16(64), uint32(64), uint32(1<<31), []byte{})
	f.Fuzz(func(t *testing.T, typ, flags uint8, tag, peer uint32, inc uint64, ini, hint uint32, dom uint64, srqn uint32, port, credits uint16, maxMsg, move uint32, app []byte) {
		r := Req{Type: Type(typ), Flags: Flags(flags), ConnTag: tag, PeerTag: peer, Incarnation: inc,
			INIQPN: ini, TGTQPNHint: hint, DomainHint: dom, SRQN: srqn, ReplyPort: port, Credits: credits, MaxMessage: maxMsg, Move: move}
		if r.SetApp(app) != nil {
			return
		}
		exactReq(t, r)
	})
}

// refusedRightly fails t if the decoder refused (err) an input b that the
// spec oracle allows (spec nil): a decoder must refuse only what the
// document forbids, or an honest peer's message is lost (a dial failed, a
// FIN ignored). The error is the decoder's own kind, which the acceptor
// turns into a REJECT reason.
func refusedRightly(t *testing.T, b []byte, err, spec error) {
	t.Helper()
	var de *DecodeError
	if !errors.As(err, &de) {
		t.Fatalf("%x refused with %v (a %T), not a DecodeError", b, err, err)
	}
	if spec == nil {
		t.Fatalf("%x refused (%v), but docs/xrc-protocol.md allows it", b, err)
	}
}

func checkReencode(t *testing.T, in []byte, enc func([]byte) (int, error)) {
	t.Helper()
	out := make([]byte, len(in))
	n, err := enc(out)
	if err != nil {
		t.Fatalf("decoded value does not encode: %v", err)
	}
	if !bytes.Equal(out, in) {
		t.Fatalf("re-encoding differs:\n in %x\nout %x (n=%d)", in, out, n)
	}
}

// FuzzEncodeAccept: any ACCEPT encodes exactly when the document allows it
// (which keeps it to the SIDR REP budget), and survives the round trip in
// both the REP and the SIDR REP.
func FuzzEncodeAccept(f *testing.F) {
	f.Add(uint8(0), uint32(1), uint32(2), uint64(3), uint32(4), uint32(5), uint64(6), uint16(7), uint32(1<<20), uint32(0), uint32(0), uint32(0), uint64(0), []byte("app"))
	f.Add(uint8(AcceptReverse), uint32(1), uint32(2), uint64(3), uint32(4), uint32(5), uint64(6), uint16(7), uint32(64), uint32(9), uint32(10), uint32(11), uint64(12), make([]byte, MaxAcceptApp))
	f.Fuzz(func(t *testing.T, flags uint8, echo, atag uint32, inc uint64, tgt, srqn uint32, dom uint64, credits uint16, maxMsg, rtag, rini, rtgt uint32, rdom uint64, app []byte) {
		a := Accept{Flags: Flags(flags), TagEcho: echo, AcceptorTag: atag, Incarnation: inc, TGTQPN: tgt, SRQN: srqn, DomainID: dom,
			Credits: credits, MaxMessage: maxMsg, Rev: Reverse{Tag: rtag, INIQPN: rini, TGTQPN: rtgt, DomainID: rdom}}
		if a.SetApp(app) != nil {
			return
		}
		exactAccept(t, a)
	})
}

// FuzzEncodeReject: the same for REJECT, in the REJ and the SIDR REP.
func FuzzEncodeReject(f *testing.F) {
	f.Add(uint32(0), uint8(RejectDomainMismatch), uint8(2), uint8(2), uint32(0), uint64(1), []byte("x"))
	f.Add(uint32(7), uint8(RejectVersion), uint8(1), uint8(3), uint32(9), uint64(0), []byte{})
	f.Fuzz(func(t *testing.T, tag uint32, reason, lo, hi uint8, detail uint32, dom uint64, app []byte) {
		r := Reject{Tag: tag, Reason: RejectReason(reason), MinVersion: lo, MaxVersion: hi, Detail: detail, DomainID: dom}
		if r.SetApp(app) != nil {
			return
		}
		exactReject(t, r)
	})
}
