package xrc

import (
	"bytes"
	"testing"
)

// FuzzParseDomainID: the domain file is written by another process (or by
// hand), so its content is untrusted. The oracle is the documented form,
// written out here: exactly "goxrc-domain 1 " + 16 hex digits + "\n", the
// value non-zero. The parser must accept exactly those inputs, with the
// value the digits spell; an accepted input is the writer's line for that
// id up to the case of the digits (the writer writes lowercase; uppercase
// names the same id, and the content is only ever read as that number);
// and the writer's line for any non-zero id parses back to it.
func FuzzParseDomainID(f *testing.F) {
	for _, s := range []string{
		"goxrc-domain 1 00000000000000ff\n",
		"goxrc-domain 1 00000000DEADBEEF\n",
		"goxrc-domain 1 ffffffffffffffff\n",
		"goxrc-domain 1 0000000000000000\n",
		"goxrc-domain 1 00000000000000ff",
		"goxrc-domain 1 00000000000000ff\n\n",
		"goxrc-domain 1 +0000000000000ff\n",
		"goxrc-domain 1 0x000000000000ff\n",
		"goxrc-domain 1 0_00000000000ff\n",
		"goxrc-domain 2 00000000000000ff\n",
		"",
		"garbage",
	} {
		f.Add([]byte(s), uint64(0x0123456789abcdef))
	}
	f.Fuzz(func(t *testing.T, b []byte, id uint64) {
		want, wantOK := documentedDomainID(b)
		got, ok := parseDomainID(b)
		if ok != wantOK || (ok && got != want) {
			t.Fatalf("parseDomainID(%q) = %#x, %v; the documented form gives %#x, %v", b, got, ok, want, wantOK)
		}
		if ok && !bytes.EqualFold(formatDomainID(got), b) {
			t.Fatalf("accepted %q, but the writer writes %q for that id", b, formatDomainID(got))
		}
		if id == 0 {
			return
		}
		line := formatDomainID(id)
		if back, ok := parseDomainID(line); !ok || back != id {
			t.Fatalf("writer's line %q for %#x parses as %#x, %v", line, id, back, ok)
		}
		if v, ok := documentedDomainID(line); !ok || v != id {
			t.Fatalf("writer's line %q for %#x is not of the documented form", line, id)
		}
	})
}

// documentedDomainID reads b as the documented domain file line, without
// the package's parser.
func documentedDomainID(b []byte) (uint64, bool) {
	const prefix = "goxrc-domain 1 "
	if len(b) != len(prefix)+16+1 || string(b[:len(prefix)]) != prefix || b[len(b)-1] != '\n' {
		return 0, false
	}
	var v uint64
	for _, c := range b[len(prefix) : len(prefix)+16] {
		var d byte
		switch {
		case '0' <= c && c <= '9':
			d = c - '0'
		case 'a' <= c && c <= 'f':
			d = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, false
		}
		v = v<<4 | uint64(d)
	}
	return v, v != 0
}
