package wire

import (
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestProtocolDocStatesEveryDecodeCheck: checks the decoders make, each
// made here on a valid message changed in one place, and the rule of
// docs/xrc-protocol.md's "Private data" that must say so. The section lists
// what decoding checks ("checks every field's range (...)"); a check it
// does not list is a defect of the document: a peer built from it sends
// what we refuse (a REQ refused BAD_REQUEST, a REJECT read as a bare CM
// reject, CM_REJECT, its reason lost).
func TestProtocolDocStatesEveryDecodeCheck(t *testing.T) {
	b, err := os.ReadFile("../../../docs/xrc-protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	start, end := strings.Index(doc, "## Private data"), strings.Index(doc, "## Data path")
	if start < 0 || end < start {
		t.Fatal("docs/xrc-protocol.md: no \"Private data\" section")
	}
	sec := strings.Join(strings.Fields(doc[start:end]), " ")

	phys := Req{Type: TypePhysReq, ConnTag: 1, Incarnation: 1, INIQPN: 2, ReplyPort: 1, Credits: 1, MaxMessage: 64}
	rej := Reject{Tag: 1, Reason: RejectBadRequest, MinVersion: 1, MaxVersion: 1}
	enc := func(e interface{ Encode([]byte) (int, error) }, size int) []byte {
		t.Helper()
		b := make([]byte, size)
		if _, err := e.Encode(b); err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, c := range []struct {
		name   string
		msg    []byte
		at     int
		v      byte
		decode func([]byte) error
		rule   string // a regexp the section must match
	}{
		{"PHYS_REQ with a TGT hint but no REPLACES_TGT", enc(&phys, BudgetREQ), 29, 2,
			func(b []byte) error { var r Req; return DecodeReq(b, TypePhysReq, &r) },
			`a PHYS_REQ's TGT hint 0 without REPLACES_TGT`},
		{"REQ with a flag not defined for it (32)", enc(&phys, BudgetREQ), 4, 32,
			func(b []byte) error { var r Req; return DecodeReq(b, TypePhysReq, &r) },
			`no flag but those above for its type`},
		{"REJECT of reason 8", enc(&rej, BudgetREJ), 12, 8,
			func(b []byte) error { var r Reject; return DecodeReject(b, &r) },
			`a REJECT's reason one of the seven above`},
		{"REJECT of reason 0", enc(&rej, BudgetREJ), 12, 0,
			func(b []byte) error { var r Reject; return DecodeReject(b, &r) },
			`a REJECT's reason one of the seven above`},
		{"REJECT whose reserved byte is not 0", enc(&rej, BudgetREJ), 15, 1,
			func(b []byte) error { var r Reject; return DecodeReject(b, &r) },
			`(its|a REJECT's) reserved byte 0`},
		{"REJECT with a flag", enc(&rej, BudgetREJ), 4, 1,
			func(b []byte) error { var r Reject; return DecodeReject(b, &r) },
			`none on REJECT`},
		{"ACCEPT with a flag but REVERSE", enc(&Accept{TagEcho: 1, AcceptorTag: 1, Incarnation: 1, TGTQPN: 2, DomainID: 1, Credits: 1, MaxMessage: 64}, BudgetREP), 4, 1,
			func(b []byte) error { var a Accept; return DecodeAccept(b, &a) },
			`no other ACCEPT flag`},
	} {
		if err := c.decode(c.msg); err != nil {
			t.Fatalf("%s: the unchanged message does not decode: %v", c.name, err)
		}
		m := append([]byte(nil), c.msg...)
		m[c.at] = c.v
		var de *DecodeError
		if err := c.decode(m); !errors.As(err, &de) || de.RejectReason() != RejectBadRequest {
			t.Errorf("%s: decoded (%v), want a DecodeError answered BAD_REQUEST", c.name, err)
			continue
		}
		if !regexp.MustCompile(c.rule).MatchString(sec) {
			t.Errorf("%s: the decoder refuses it, and docs/xrc-protocol.md's \"Private data\" states no such rule (want %q)", c.name, c.rule)
		}
	}
}
