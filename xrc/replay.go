package xrc

// replayWindow remembers which recent data sequence numbers a receiving leg
// has taken, so that a message sent twice across an uplink recovery (it
// arrived, but its completion was lost with the old INI, so the sender sent
// it again on the new one) is taken once. It is the anti-replay window of
// IPsec (RFC 4303, section 3.4.3) kept in a ring of bits: next is one past
// the highest number seen, and bit s mod size says whether s was seen, for
// s in [next-size, next). A number older than that is taken for a
// duplicate: a sender never numbers a message size or more ahead of one
// whose completion has not come (Conn.spanFullLocked), so a first copy
// cannot fall that far behind.
type replayWindow struct {
	next uint32
	bits []uint64
}

// newReplayWindow returns the window of a receiver with this window of
// messages (replaySpan numbers), in which every number before 0 counts as
// seen: a peer's first message is number 0.
func newReplayWindow(window int) replayWindow {
	w := replayWindow{bits: make([]uint64, replaySpan(window)/64)}
	for i := range w.bits {
		w.bits[i] = ^uint64(0)
	}
	return w
}

func (w *replayWindow) size() uint32 { return uint32(len(w.bits) * 64) }

func (w *replayWindow) mark(s uint32, seen bool) {
	i, bit := (s%w.size())/64, uint64(1)<<(s%64)
	if seen {
		w.bits[i] |= bit
	} else {
		w.bits[i] &^= bit
	}
}

func (w *replayWindow) seen(s uint32) bool {
	return w.bits[(s%w.size())/64]&(1<<(s%64)) != 0
}

// farAhead reports whether s is the window's size or more ahead of next,
// which no sender keeping to its credits numbers a message: it has at most
// the receiver's window (half the size or less) of messages not yet taken
// by the receiver, whose numbers therefore stay below next plus the window.
func (w *replayWindow) farAhead(s uint32) bool {
	d := s - w.next
	return int32(d) >= 0 && d >= w.size()
}

// take records s and reports whether it is new. Numbers wrap: one less
// than 2^31 ahead of next is ahead, anything else behind.
func (w *replayWindow) take(s uint32) bool {
	size := w.size()
	if d := s - w.next; int32(d) >= 0 {
		// The numbers from next up to s enter the window unseen.
		if d >= size {
			clear(w.bits)
		} else {
			for x := w.next; x != s; x++ {
				w.mark(x, false)
			}
		}
		w.mark(s, true)
		w.next = s + 1
		return true
	}
	if w.next-1-s >= size || w.seen(s) {
		return false
	}
	w.mark(s, true)
	return true
}
