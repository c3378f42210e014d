package wire

import (
	"bytes"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// The spec oracle: what docs/xrc-protocol.md ("Private data, version 4")
// says a message must be, written out here from the document, with its
// numbers, without the codec's validate, constants or helpers. The decode
// fuzzers run it on every input a decoder accepts (the encode fuzzers on
// every encoding), so a range check missing from validate, which Encode and
// Decode share and which a round trip therefore cannot see, is caught by the
// first input the fuzzer finds that breaks it. Each spec* function checks
// the raw bytes (framing, layout, ranges) and then that the decoded value
// holds what the documented layout puts at each offset.

// be reads a big-endian unsigned integer of len(b) bytes.
func be(b []byte) uint64 {
	var v uint64
	for _, c := range b {
		v = v<<8 | uint64(c)
	}
	return v
}

type specFailure string

type specCheck struct{ b []byte }

func (specCheck) must(ok bool, rule string) {
	if !ok {
		panic(specFailure(rule))
	}
}

func (specCheck) equal(got, want uint64, field string) {
	if got != want {
		panic(specFailure(fmt.Sprintf("%s decoded as %#x; the documented layout gives %#x", field, got, want)))
	}
}

// runSpec runs an oracle on b and returns the rule it broke, if any.
func runSpec(b []byte, check func(s specCheck)) (err error) {
	defer func() {
		if p := recover(); p != nil {
			rule, ok := p.(specFailure)
			if !ok {
				panic(p)
			}
			err = fmt.Errorf("accepted against docs/xrc-protocol.md: %s\ninput %x", rule, b)
		}
	}()
	check(specCheck{b})
	return nil
}

// frame checks the header and framing ("Header, 8 bytes: magic 0x5852,
// version 4, type, flags, reserved 0, total length"; "The kernel pads
// received private data with zeros to the carrier's maximum; decoding reads
// the header's length, requires the padding to be zero") and returns the
// declared length. fixed is the type's fixed size, budget the most the
// declared length may be, carrier the largest input (its largest carrier).
func (s specCheck) frame(typ, flags byte, fixed, budget, carrier int) int {
	b := s.b
	s.must(len(b) >= 8, "shorter than the 8-byte header")
	s.must(b[0] == 0x58 && b[1] == 0x52, "magic not 0x5852")
	if typ != 4 {
		s.must(b[2] == 4, "version not 4")
	} else { // "a REJECT of any version but 0 decodes"
		s.must(b[2] != 0, "REJECT of version 0")
	}
	s.must(b[3] == typ, "wrong type")
	s.must(b[4]&^flags == 0, "a flag not defined for the type")
	s.must(b[5] == 0, "reserved header byte not 0")
	n := int(be(b[6:8]))
	s.must(n >= fixed, "length below the fixed size")
	s.must(n <= budget, "length over the carrier budget")
	s.must(n <= len(b), "length past the input")
	s.must(len(b) <= carrier, "input longer than the largest carrier")
	for _, c := range b[n:] {
		s.must(c == 0, "non-zero padding")
	}
	return n
}

// specReq: the REQ row of the table (fixed size 54; carriers PHYS 56, VIRT
// 180) and the ranges: conn tag, incarnation, credits and reply port
// non-zero, max message 64 to 1 MiB, QPNs and SRQN 24-bit, a peer tag
// exactly with RECIPROCAL or ONE_EXCHANGE (never both), ONE_EXCHANGE only on
// a VIRT_REQ without MOVE, VIRT needs a hint and a domain, REPLACES_TGT
// needs a hint and only PHYS may carry it, a PHYS_REQ's hint is 0 without
// REPLACES_TGT (the acceptor's table: "PHYS_REQ (hint 0, or REPLACES_TGT)"),
// a move generation exactly with MOVE.
// r, if not nil, is the decoded value.
func specReq(b []byte, want Type, r *Req) error {
	return runSpec(b, func(s specCheck) {
		typ, budget := byte(1), 56
		if want == TypeVirtReq {
			typ, budget = 2, 180
		}
		n := s.frame(typ, 1|2|4|8|16, 54, budget, budget)
		flags := b[4]
		conn, peer, inc := be(b[8:12]), be(b[12:16]), be(b[16:24])
		ini, hint, dom, srqn := be(b[24:27]), be(b[27:30]), be(b[30:38]), be(b[38:41])
		port, credits, maxMsg, gen, appLen := be(b[41:43]), be(b[43:45]), be(b[45:49]), be(b[49:53]), int(b[53])

		s.must(n == 54+appLen, "length is not 54 + app len")
		s.must(conn != 0, "conn tag 0")
		s.must(inc != 0, "incarnation 0")
		s.must(port != 0, "reply port 0")
		s.must(credits != 0, "credits 0")
		s.must(maxMsg >= 64 && maxMsg <= 1<<20, "max message outside 64..1 MiB")
		s.must(hint == 0 || hint >= 2, "TGT hint 1")
		recip, replaces, move, one, abort := flags&1 != 0, flags&2 != 0, flags&4 != 0, flags&8 != 0, flags&16 != 0
		// "ABORT only on a VIRT_REQ with RECIPROCAL and no other flag, and
		// then INI QPN, TGT hint and domain hint 0"
		s.must(!abort || typ == 2 && flags == 1|16, "ABORT but on a VIRT_REQ with RECIPROCAL alone")
		if abort {
			s.must(ini == 0 && hint == 0 && dom == 0, "ABORT naming a QP or a domain")
		} else {
			s.must(ini >= 2, "INI QPN below 2")
		}
		s.must(!(recip && one), "RECIPROCAL with ONE_EXCHANGE")
		s.must((peer != 0) == (recip || one), "a peer tag without RECIPROCAL or ONE_EXCHANGE, or one of them without a peer tag")
		s.must(!one || (typ == 2 && !move), "ONE_EXCHANGE on a PHYS_REQ or with MOVE")
		s.must(move == (gen != 0), "a move generation without MOVE, or MOVE without one")
		if typ == 2 {
			s.must(!replaces, "REPLACES_TGT on a VIRT_REQ")
			s.must(abort || hint != 0, "VIRT_REQ without a TGT hint")
			s.must(abort || dom != 0, "VIRT_REQ without a domain")
		} else if replaces {
			s.must(hint != 0, "REPLACES_TGT without a TGT hint")
		} else {
			s.must(hint == 0, "PHYS_REQ with a hint but no REPLACES_TGT")
		}
		if r == nil {
			return
		}
		s.equal(uint64(r.Type), uint64(typ), "type")
		s.equal(uint64(r.Flags), uint64(flags), "flags")
		s.equal(uint64(r.ConnTag), conn, "conn tag")
		s.equal(uint64(r.PeerTag), peer, "peer tag")
		s.equal(r.Incarnation, inc, "incarnation")
		s.equal(uint64(r.INIQPN), ini, "INI QPN")
		s.equal(uint64(r.TGTQPNHint), hint, "TGT hint")
		s.equal(r.DomainHint, dom, "domain hint")
		s.equal(uint64(r.SRQN), srqn, "SRQN")
		s.equal(uint64(r.ReplyPort), port, "reply port")
		s.equal(uint64(r.Credits), credits, "credits")
		s.equal(uint64(r.MaxMessage), maxMsg, "max message")
		s.equal(uint64(r.Move), gen, "move generation")
		s.must(bytes.Equal(r.App(), b[54:n]), "app data differs")
	})
}

// specAccept: the ACCEPT row (fixed 45, 63 with REVERSE; kept within 136,
// may arrive in a REP of 196), tags, incarnation, domain and credits
// non-zero, max message 64 to 1 MiB, QPNs 24-bit; REVERSE: "the flag and the
// 18-byte section together, every field in range (tag and domain non-zero,
// QPNs 24-bit and >= 2), no other ACCEPT flag".
func specAccept(b []byte, a *Accept) error {
	return runSpec(b, func(s specCheck) {
		n := s.frame(3, 8, 45, 136, 196)
		rev := b[4]&8 != 0
		fixed := 45
		if rev {
			fixed = 63
		}
		s.must(n >= fixed, "length below the fixed size with REVERSE")
		echo, atag, inc := be(b[8:12]), be(b[12:16]), be(b[16:24])
		tgt, srqn, dom := be(b[24:27]), be(b[27:30]), be(b[30:38])
		credits, maxMsg, appLen := be(b[38:40]), be(b[40:44]), int(b[44])

		s.must(n == fixed+appLen, "length is not the fixed size + app len")
		s.must(echo != 0, "tag echo 0")
		s.must(atag != 0, "acceptor tag 0")
		s.must(inc != 0, "incarnation 0")
		s.must(dom != 0, "domain id 0")
		s.must(tgt >= 2, "TGT QPN below 2")
		s.must(credits != 0, "credits 0")
		s.must(maxMsg >= 64 && maxMsg <= 1<<20, "max message outside 64..1 MiB")
		var rtag, rini, rtgt, rdom uint64
		if rev {
			rtag, rini, rtgt, rdom = be(b[45:49]), be(b[49:52]), be(b[52:55]), be(b[55:63])
			s.must(rtag != 0, "reverse tag 0")
			s.must(rini >= 2, "reverse INI QPN below 2")
			s.must(rtgt >= 2, "reverse TGT QPN below 2")
			s.must(rdom != 0, "reverse domain 0")
		}
		if a == nil {
			return
		}
		s.equal(uint64(a.Flags), uint64(b[4]), "flags")
		s.equal(uint64(a.TagEcho), echo, "tag echo")
		s.equal(uint64(a.AcceptorTag), atag, "acceptor tag")
		s.equal(a.Incarnation, inc, "incarnation")
		s.equal(uint64(a.TGTQPN), tgt, "TGT QPN")
		s.equal(uint64(a.SRQN), srqn, "SRQN")
		s.equal(a.DomainID, dom, "domain id")
		s.equal(uint64(a.Credits), credits, "credits")
		s.equal(uint64(a.MaxMessage), maxMsg, "max message")
		s.equal(uint64(a.Rev.Tag), rtag, "reverse tag")
		s.equal(uint64(a.Rev.INIQPN), rini, "reverse INI QPN")
		s.equal(uint64(a.Rev.TGTQPN), rtgt, "reverse TGT QPN")
		s.equal(a.Rev.DomainID, rdom, "reverse domain")
		s.must(bytes.Equal(a.App(), b[fixed:n]), "app data differs")
	})
}

// specReject: the REJECT row (fixed 29, kept within 136, may arrive in a REJ
// of 148; no flags; reserved byte 0), reasons 1 to 7, DOMAIN_MISMATCH
// "carries the rejecter's domain id", a min version non-zero and no more
// than the max. The tag is 0 for an unreadable REQ, and the document sets
// no range on the detail.
func specReject(b []byte, r *Reject) error {
	return runSpec(b, func(s specCheck) {
		n := s.frame(4, 0, 29, 136, 148)
		tag, reason, lo, hi := be(b[8:12]), b[12], b[13], b[14]
		detail, dom, appLen := be(b[16:20]), be(b[20:28]), int(b[28])
		s.must(b[15] == 0, "reserved byte not 0")
		s.must(n == 29+appLen, "length is not 29 + app len")
		s.must(reason >= 1 && reason <= 7, "reason outside 1..7")
		s.must(reason != 4 || dom != 0, "DOMAIN_MISMATCH without a domain id")
		s.must(lo != 0 && lo <= hi, "min version 0 or above the max")
		if r == nil {
			return
		}
		s.equal(uint64(r.Tag), tag, "tag")
		s.equal(uint64(r.Reason), uint64(reason), "reason")
		s.equal(uint64(r.MinVersion), uint64(lo), "min version")
		s.equal(uint64(r.MaxVersion), uint64(hi), "max version")
		s.equal(uint64(r.Detail), detail, "detail")
		s.equal(r.DomainID, dom, "domain id")
		s.must(bytes.Equal(r.App(), b[29:n]), "app data differs")
	})
}

// specFIN: "receiver's tag u32, sender's tag u32", 16 bytes in-band (no
// padding), the one flag HALF 1, tags non-zero.
func specFIN(b []byte, f *FIN) error {
	return runSpec(b, func(s specCheck) {
		s.frame(5, 1, 16, 16, 16)
		tag, sender := be(b[8:12]), be(b[12:16])
		s.must(tag != 0, "receiver's tag 0")
		s.must(sender != 0, "sender's tag 0")
		if f == nil {
			return
		}
		s.equal(uint64(f.Tag), tag, "tag")
		s.equal(uint64(f.SenderTag), sender, "sender tag")
		s.must(f.Half == (b[4]&1 != 0), "HALF decoded wrong")
	})
}

// The edge seeds are valid messages with every bounded field at its bound
// (1 for a non-zero field, 64 or 1 MiB for max message, 2 for a QPN that
// must be >= 2), so that one mutated byte takes a field out of range.

func seedEdgeReqs(f *testing.F) {
	for _, r := range edgeReqs() {
		b := make([]byte, maxIn(r.Type))
		if _, err := r.Encode(b); err != nil {
			f.Fatalf("edge seed %+v: %v", r, err)
		}
		f.Add(b, uint8(r.Type))
	}
}

func edgeReqs() []Req {
	var out []Req
	for _, c := range []struct {
		t     Type
		flags Flags
		peer  uint32
		hint  uint32
		max   uint32
	}{
		{TypePhysReq, 0, 0, 0, 64},
		{TypePhysReq, FlagReplacesTGT | FlagMove, 0, 2, 1 << 20},
		{TypePhysReq, FlagReciprocal, 1, 0, 64},
		{TypeVirtReq, FlagOneExchange, 1, 2, 64},
		{TypeVirtReq, FlagReciprocal | FlagMove, 1, 2, 1 << 20},
		{TypeVirtReq, FlagReciprocal | FlagAbort, 1, 0, 64},
	} {
		r := Req{Type: c.t, Flags: c.flags, ConnTag: 1, PeerTag: c.peer, Incarnation: 1, INIQPN: 2,
			TGTQPNHint: c.hint, ReplyPort: 1, Credits: 1, MaxMessage: c.max}
		if c.t == TypeVirtReq {
			r.DomainHint = 1
		}
		if c.flags&FlagMove != 0 {
			r.Move = 1
		}
		if c.flags&FlagAbort != 0 { // names no QP and no domain
			r.INIQPN, r.DomainHint = 0, 0
		}
		out = append(out, r)
	}
	return out
}

func edgeAccepts() []Accept {
	var out []Accept
	for _, rev := range []bool{false, true} {
		a := Accept{TagEcho: 1, AcceptorTag: 1, Incarnation: 1, TGTQPN: 2, DomainID: 1, Credits: 1, MaxMessage: 64}
		if rev {
			a.Flags, a.MaxMessage = AcceptReverse, 1<<20
			a.Rev = Reverse{Tag: 1, INIQPN: 2, TGTQPN: 2, DomainID: 1}
		}
		out = append(out, a)
	}
	return out
}

func seedEdgeAccepts(f *testing.F) {
	for _, a := range edgeAccepts() {
		b := make([]byte, BudgetSIDRREP)
		if _, err := a.Encode(b); err != nil {
			f.Fatalf("edge seed %+v: %v", a, err)
		}
		f.Add(b)
	}
}

func seedEdgeRejects(f *testing.F) {
	for _, reason := range []RejectReason{RejectVersion, RejectDomainMismatch, RejectBadRequest} {
		r := Reject{Tag: 1, Reason: reason, MinVersion: 1, MaxVersion: 1}
		if reason == RejectDomainMismatch {
			r.DomainID = 1
		}
		b := make([]byte, BudgetREJ)
		if _, err := r.Encode(b); err != nil {
			f.Fatalf("edge seed %+v: %v", r, err)
		}
		f.Add(b)
	}
}

// TestSpecOracle checks the oracle itself: it passes the edge messages, and
// refuses each of them with one field taken out of the documented range (as
// a decoder missing that check would let through).
func TestSpecOracle(t *testing.T) {
	enc := func(e interface{ Encode([]byte) (int, error) }, size int) []byte {
		b := make([]byte, size)
		if _, err := e.Encode(b); err != nil {
			t.Fatal(err)
		}
		return b
	}
	reqs := edgeReqs()
	phys, virt := reqs[0], reqs[3]
	acc := edgeAccepts()[1]
	rej := Reject{Tag: 0, Reason: RejectDomainMismatch, MinVersion: 1, MaxVersion: 1, DomainID: 1}
	fin := FIN{Tag: 1, SenderTag: 1}
	for _, r := range reqs {
		if err := specReq(enc(&r, maxIn(r.Type)), r.Type, &r); err != nil {
			t.Errorf("%+v: %v", r, err)
		}
	}
	for _, a := range edgeAccepts() {
		if err := specAccept(enc(&a, BudgetREP), &a); err != nil {
			t.Errorf("%+v: %v", a, err)
		}
	}
	if err := specReject(enc(&rej, BudgetREJ), &rej); err != nil {
		t.Error(err)
	}
	if err := specFIN(enc(&fin, FinLen), &fin); err != nil {
		t.Error(err)
	}

	type mutant struct {
		name string
		at   int
		v    byte
	}
	for _, m := range []mutant{
		{"magic", 0, 0}, {"version", 2, 1}, {"header reserved", 5, 1}, {"padding", 55, 1},
		{"unknown flag", 4, 16}, {"ONE_EXCHANGE on PHYS", 4, 8},
		{"conn tag 0", 11, 0}, {"incarnation 0", 23, 0}, {"hint without REPLACES_TGT", 29, 2},
		{"reply port 0", 42, 0}, {"credits 0", 44, 0}, {"max message 63", 48, 63},
		{"peer tag without a flag", 15, 1}, {"length", 7, 51}, {"move generation without MOVE", 52, 1},
	} {
		b := enc(&phys, BudgetREQ)
		b[m.at] = m.v
		if specReq(b, TypePhysReq, nil) == nil {
			t.Errorf("PHYS_REQ with %s passed the oracle", m.name)
		}
	}
	if b := enc(&reqs[1], BudgetREQ); true {
		b[52] = 0 // the edge MOVE's generation is 1
		if specReq(b, TypePhysReq, nil) == nil {
			t.Error("PHYS_REQ MOVE without a move generation passed the oracle")
		}
	}
	for _, m := range []mutant{
		{"no hint", 29, 0}, {"no domain", 37, 0}, {"no peer tag", 15, 0},
		{"ONE_EXCHANGE with MOVE", 4, 8 | 4}, {"REPLACES_TGT", 4, 8 | 2}, {"both peer flags", 4, 8 | 1},
	} {
		b := enc(&virt, BudgetSIDRREQ)
		b[m.at] = m.v
		if specReq(b, TypeVirtReq, nil) == nil {
			t.Errorf("VIRT_REQ with %s passed the oracle", m.name)
		}
	}
	for _, m := range []mutant{
		{"tag echo 0", 11, 0}, {"acceptor tag 0", 15, 0}, {"incarnation 0", 23, 0},
		{"domain 0", 37, 0}, {"credits 0", 39, 0}, {"max message over 1 MiB", 43, 1},
		{"reverse tag 0", 48, 0}, {"reverse INI 1", 51, 1}, {"reverse TGT 1", 54, 1},
		{"reverse domain 0", 62, 0}, {"another flag", 4, 8 | 1}, {"no REVERSE", 4, 0},
	} {
		b := enc(&acc, BudgetREP)
		b[m.at] = m.v
		if specAccept(b, nil) == nil {
			t.Errorf("ACCEPT with %s passed the oracle", m.name)
		}
	}
	for _, m := range []mutant{
		{"reason 0", 12, 0}, {"reason 8", 12, 8}, {"reserved", 15, 1},
		{"no domain", 27, 0}, {"a flag", 4, 1},
	} {
		b := enc(&rej, BudgetREJ)
		b[m.at] = m.v
		if specReject(b, nil) == nil {
			t.Errorf("REJECT with %s passed the oracle", m.name)
		}
	}
	for _, m := range []mutant{{"tag 0", 11, 0}, {"sender tag 0", 15, 0}, {"flag 2", 4, 2}} {
		b := enc(&fin, FinLen)
		b[m.at] = m.v
		if specFIN(b, nil) == nil {
			t.Errorf("FIN with %s passed the oracle", m.name)
		}
	}
}

// TestPackageDocMatchesLayout checks the layout the package documentation
// (doc.go) states against the codec: the version in the header, the REQ's
// move generation and each fixed size. doc.go described version 2 after
// version 3 had added the move generation to REQ.
func TestPackageDocMatchesLayout(t *testing.T) {
	b, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	num := func(re string) int {
		t.Helper()
		m := regexp.MustCompile(re).FindStringSubmatch(doc)
		if m == nil {
			t.Fatalf("doc.go: no match for %q", re)
		}
		n, _ := strconv.Atoi(m[1])
		return n
	}
	if v := num(`version\s+uint8\s+(\d+)`); v != int(Version) {
		t.Errorf("doc.go says version %d, the codec speaks %d", v, Version)
	}
	if !regexp.MustCompile(`max message u32,\s+move u32`).MatchString(doc) {
		t.Error("doc.go's REQ has no move generation after max message")
	}
	for _, c := range []struct {
		re   string
		want int
	}{
		{`\(fixed part (\d+) bytes\)`, reqFixed},
		{`\(fixed part (\d+)\), with REVERSE`, acceptFixed},
		{`app data \((\d+)\)`, rejectFixed},
	} {
		if got := num(c.re); got != c.want {
			t.Errorf("doc.go: %q gives %d bytes, the codec %d", c.re, got, c.want)
		}
	}
}

// TestSpecOracleRejectVersionZero: the document lets a REJECT of any version
// but 0 decode, and the oracle must hold the "but 0" too, or
// FuzzDecodeReject would pass a decoder that took version 0.
func TestSpecOracleRejectVersionZero(t *testing.T) {
	r := Reject{Tag: 1, Reason: RejectVersion, MinVersion: 1, MaxVersion: 1}
	b := make([]byte, BudgetREJ)
	if _, err := r.Encode(b); err != nil {
		t.Fatal(err)
	}
	for _, v := range []byte{1, 2, Version, 200} {
		b[2] = v
		if err := specReject(b, nil); err != nil {
			t.Errorf("REJECT of version %d refused by the oracle: %v", v, err)
		}
	}
	b[2] = 0
	if specReject(b, nil) == nil {
		t.Error("REJECT of version 0 passed the oracle")
	}
}

// TestPackageDocNamesEveryFlag: the header's flags in doc.go are the codec's,
// each with its value, and none is left out (ABORT was).
func TestPackageDocNamesEveryFlag(t *testing.T) {
	b, err := os.ReadFile("doc.go")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	var all Flags
	for _, f := range []struct {
		name string
		v    Flags
	}{
		{"RECIPROCAL", FlagReciprocal}, {"REPLACES_TGT", FlagReplacesTGT}, {"MOVE", FlagMove},
		{"ONE_EXCHANGE", FlagOneExchange}, {"ABORT", FlagAbort},
		{"REVERSE", AcceptReverse}, {"HALF", FINHalf},
	} {
		if want := fmt.Sprintf("%s=%d", f.name, f.v); !strings.Contains(doc, want) {
			t.Errorf("doc.go's header does not list %s", want)
		}
		if f.name != "REVERSE" && f.name != "HALF" {
			all |= f.v
		}
	}
	if all != knownFlags {
		t.Errorf("REQ flags listed %#x, the codec knows %#x", all, knownFlags)
	}
}
