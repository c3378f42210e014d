package wire

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestProtocolDocNumbersMatchCodec holds the numbers of docs/xrc-protocol.md's
// "Private data" section against the codec's constants: the version in the
// heading and the header, the magic, the type and flag values, the REJECT's
// frozen header version, each message's fixed size and carrier budget, the
// reason codes (and their names, as RejectReason.String gives them), the
// max message range and the app data a REVERSE ACCEPT leaves room for.
// TestPackageDocMatchesLayout does this for doc.go; nothing read the
// protocol document itself, whose table a change of layout could leave
// behind.
func TestProtocolDocNumbersMatchCodec(t *testing.T) {
	b, err := os.ReadFile("../../../docs/xrc-protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	start := strings.Index(doc, "## Private data")
	end := strings.Index(doc, "## Data path")
	if start < 0 || end < start {
		t.Fatal("docs/xrc-protocol.md: no \"Private data\" section")
	}
	// One line per sentence part: the table and the prose, without the
	// emphasis and with the line breaks as spaces.
	sec := strings.NewReplacer("**", "", "\n", " ").Replace(doc[start:end])
	num := func(re string) int {
		t.Helper()
		m := regexp.MustCompile(re).FindStringSubmatch(sec)
		if m == nil {
			t.Fatalf("docs/xrc-protocol.md, Private data: no match for %q", re)
		}
		n, err := strconv.ParseInt(m[1], 0, 64)
		if err != nil {
			t.Fatalf("%q: %v", re, err)
		}
		return int(n)
	}
	for _, c := range []struct {
		what string
		re   string
		want int
	}{
		{"heading's version", `^## Private data, version (\d+)`, int(Version)},
		{"header's version", `magic ` + "`" + `0x5852` + "`" + `, version (\d+)`, int(Version)},
		{"magic", `magic ` + "`" + `(0x[0-9a-fA-F]+)` + "`", int(Magic)},
		{"PHYS_REQ", `PHYS_REQ (\d+),`, int(TypePhysReq)},
		{"VIRT_REQ", `VIRT_REQ (\d+),`, int(TypeVirtReq)},
		{"ACCEPT", `ACCEPT (\d+),`, int(TypeAccept)},
		{"REJECT", `REJECT (\d+),`, int(TypeReject)},
		{"FIN", `FIN (\d+)\)`, int(TypeFIN)},
		{"RECIPROCAL", `RECIPROCAL (\d+)`, int(FlagReciprocal)},
		{"REPLACES_TGT", `REPLACES_TGT (\d+)`, int(FlagReplacesTGT)},
		{"MOVE", `MOVE (\d+),`, int(FlagMove)},
		{"ONE_EXCHANGE", `ONE_EXCHANGE (\d+),`, int(FlagOneExchange)},
		{"ABORT", `ABORT (\d+);`, int(FlagAbort)},
		{"REVERSE", `ACCEPT: REVERSE\s+(\d+)`, int(AcceptReverse)},
		{"HALF", `FIN: HALF (\d+)`, int(FINHalf)},
		{"REJECT's header version", `always carries version (\d+) in its header`, int(rejectVersion)},
		{"REQ fixed size", `\| REQ \|[^|]*\| (\d+) \|`, reqFixed},
		{"PHYS_REQ budget", `PHYS (\d+) \(REQ\)`, BudgetREQ},
		{"VIRT_REQ budget", `VIRT (\d+) \(SIDR REQ\)`, BudgetSIDRREQ},
		{"ACCEPT fixed size", `\| ACCEPT \|[^|]*\| (\d+), \d+ with REVERSE \|`, acceptFixed},
		{"ACCEPT fixed size with REVERSE", `\| ACCEPT \|[^|]*\| \d+, (\d+) with REVERSE \|`, acceptFixed + ReverseLen},
		{"ACCEPT budget", `with REVERSE \| (\d+) \(fits a SIDR REP`, acceptMaxOut},
		{"REP", `REP allows (\d+)\)`, BudgetREP},
		{"REJECT fixed size", `\| REJECT \|[^|]*\| (\d+) \|`, rejectFixed},
		{"REJECT budget", `\| REJECT \|[^|]*\| \d+ \| (\d+) \(may ride a SIDR REP`, rejectMaxOut},
		{"SIDR REP", `with REVERSE \| (\d+) \(fits a SIDR REP`, BudgetSIDRREP},
		{"REJ", `REJ allows (\d+)\)`, BudgetREJ},
		{"FIN size", `\| FIN \|[^|]*\| (\d+) \|`, FinLen},
		{"REVERSE section", `and the (\d+)-byte section together`, ReverseLen},
		{"REVERSE app data", `within \d+ bytes \(app data <= (\d+)\)`, BudgetSIDRREP - acceptFixed - ReverseLen},
		{"REVERSE whole", `the whole still within (\d+) bytes`, acceptMaxOut},
		{"least max message", `max message (\d+) to 1 MiB`, MinMessage},
	} {
		if got := num(c.re); got != c.want {
			t.Errorf("docs/xrc-protocol.md gives %s %d, the codec %d", c.what, got, c.want)
		}
	}
	if MaxMessage != 1<<20 {
		t.Errorf("the document's max message is 1 MiB, the codec's %d", MaxMessage)
	}
	// Reasons: every code, by its name, and nothing more (the decoder
	// refuses a REJECT with any other).
	m := regexp.MustCompile(`Reasons: (.*?)\. The kernel pads`).FindStringSubmatch(sec)
	if m == nil {
		t.Fatal("docs/xrc-protocol.md: no list of reasons")
	}
	listed := regexp.MustCompile(`\b([A-Z_]{3,}) (\d+)\b`).FindAllStringSubmatch(m[1], -1)
	seen := map[RejectReason]bool{}
	for _, l := range listed {
		n, _ := strconv.Atoi(l[2])
		r := RejectReason(n)
		if r.String() != l[1] {
			t.Errorf("the document's reason %s is %d, which the codec names %v", l[1], n, r)
		}
		seen[r] = true
	}
	for r := RejectVersion; r <= RejectBadRequest; r++ {
		if !seen[r] {
			t.Errorf("the document lists no reason %d (%v)", r, r)
		}
	}
	if len(seen) != int(RejectBadRequest) {
		t.Errorf("the document lists %d reasons, the codec knows %d", len(seen), RejectBadRequest)
	}
}
