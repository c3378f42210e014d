package xrc

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestProtocolDocNumbersMatchEngine holds the engine's numbers that
// docs/xrc-protocol.md states against the constants that make them: the
// tags and legs remembered, the Accept backlog, the TGTs a moved leg
// remembers, the tries of a post, the poll bound while a handle lingers,
// the addresses' domains remembered, the TGT_GONE rounds, the credit
// timer, the defaults, the least replay span.
func TestProtocolDocNumbersMatchEngine(t *testing.T) {
	b, err := os.ReadFile("../docs/xrc-protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := strings.ReplaceAll(string(b), "\n", " ")
	for _, c := range []struct {
		what string
		re   string
		want int
	}{
		{"released tags kept from reuse", `nor one of\s+the last (\d+) released by the same source`, retiredMax},
		{"retired legs", `among the last (\d+) legs that carried a message`, retiredMax},
		{"Accept backlog", `or (\d+) inbound connections are being made`, acceptBacklog},
		{"TGTs a moved leg remembers", `it remembers (\d+) TGTs it left`, maxPrev},
		{"tries of a message posted again", `posted again after (\d+) INIs that failed`, maxTries},
		{"tries of a post that finds the queue full", `tries again at once, (\d+) times, then fails the INI`, maxTries},
		{"poll bound while a handle lingers (ms)", `its receive polls end within (\d+) ms`, int(lingerPoll / time.Millisecond)},
		{"addresses' domains remembered", `remembers the domains of its last (\d+) addresses`, maxAddrDoms},
		{"TGT_GONE rounds", `for\s+at most (\d+) such rounds in a row`, maxGoneRounds},
		{"credit timer's first delay (us)", `after (\d+) us if the application took none`, int(minOwed / time.Microsecond)},
		{"credit timer's longest delay (ms)", `the delay doubling\s+\(to (\d+) ms\)`, int(maxOwed / time.Millisecond)},
		{"default window", "`Config.RecvWindow` \\(cm: `WithQueueDepth`;\\s+default (\\d+)\\)", DefaultRecvWindow},
		{"default idle timeout (s)", "`Config.IdleTimeout`, (\\d+) s by\\s+default", int(DefaultIdleTimeout / time.Second)},
		{"least replay span", `rounded up to a power of two, at least (\d+)`, int(replaySpan(1))},
		{"data frame header", `plus the (\d+)-byte data frame header`, frameSize(0)},
	} {
		m := regexp.MustCompile(c.re).FindStringSubmatch(doc)
		if m == nil {
			t.Errorf("docs/xrc-protocol.md: no match for %q (%s)", c.re, c.what)
			continue
		}
		if n, _ := strconv.Atoi(m[1]); n != c.want {
			t.Errorf("docs/xrc-protocol.md gives %s %d, the engine %d", c.what, n, c.want)
		}
	}
}
