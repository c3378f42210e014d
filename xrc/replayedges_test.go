package xrc

import "testing"

// TestReplayWindowEdges pins the two edges of a receiving leg's sequence
// numbers that docs/xrc-protocol.md states ("Data path" and "Duplicates
// across a recovery") to what the receive loop does with them
// (consumeFrameLocked: farAhead, then take): the window holds the span
// numbers up to the highest (highest - span, unseen, is dropped as a
// duplicate), and highest + span is taken, highest + span + 1 an overrun.
// The document had both edges one number off until a review.
func TestReplayWindowEdges(t *testing.T) {
	for _, window := range []int{1, 33, 64, 65535} {
		span := replaySpan(window)
		// Before the first message, highest is -1: span - 1 is taken,
		// span fails the connection.
		if w := newReplayWindow(window); w.farAhead(span - 1) {
			t.Errorf("window %d: first number %d (highest -1 + span) taken for an overrun", window, span-1)
		}
		if w := newReplayWindow(window); !w.farAhead(span) {
			t.Errorf("window %d: first number %d (highest -1 + span + 1) not taken for an overrun", window, span)
		}
		// Every number from 0 to highest but two, the oldest the window
		// may and may not hold.
		highest := 3 * span
		out, in := highest-span, highest-span+1
		w := newReplayWindow(window)
		for s := uint32(0); s <= highest; s++ {
			if s != out && s != in && !w.take(s) {
				t.Fatalf("window %d: %d in order taken for a duplicate", window, s)
			}
		}
		if w.farAhead(highest + span) {
			t.Errorf("window %d: highest + span taken for an overrun", window)
		}
		if !w.farAhead(highest + span + 1) {
			t.Errorf("window %d: highest + span + 1 not taken for an overrun", window)
		}
		if !w.take(in) {
			t.Errorf("window %d: highest - span + 1, unseen, dropped as a duplicate", window)
		}
		if w.take(out) {
			t.Errorf("window %d: highest - span, older than the window, taken", window)
		}
	}
}
