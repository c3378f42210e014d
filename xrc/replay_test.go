package xrc

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"
)

// replayModel is replayWindow's specification, kept the slow way: the set
// of numbers seen within the window behind next.
type replayModel struct {
	next uint32
	size uint32
	seen map[uint32]bool
}

func newReplayModel(size, start uint32) *replayModel {
	m := &replayModel{next: start, size: size, seen: map[uint32]bool{}}
	for x := uint32(1); x <= size; x++ {
		m.seen[start-x] = true // numbers before the first count as seen
	}
	return m
}

func (m *replayModel) take(s uint32) bool {
	if int32(s-m.next) >= 0 {
		m.next = s + 1
		for x := range m.seen {
			if m.next-1-x >= m.size {
				delete(m.seen, x)
			}
		}
		m.seen[s] = true
		return true
	}
	if m.next-1-s >= m.size || m.seen[s] {
		return false
	}
	m.seen[s] = true
	return true
}

// checkReplay runs seqs through the window of a receiver with this window
// of messages, its next number start, and through the model, and compares.
func checkReplay(t *testing.T, window int, start uint32, seqs []uint32) {
	t.Helper()
	w := newReplayWindow(window)
	w.next = start
	m := newReplayModel(w.size(), start)
	for i, s := range seqs {
		if got, want := w.take(s), m.take(s); got != want {
			t.Fatalf("window %d, number %d (%d): new %v, want %v", window, i, s, got, want)
		}
	}
}

func TestReplayWindow(t *testing.T) {
	w := newReplayWindow(64) // 128 numbers
	// Spans are powers of two: a ring that does not divide 2^32 would
	// place a number differently before and after the wrap.
	for window, want := range map[int]uint32{1: 64, 32: 64, 33: 128, 64: 128, 170: 512, 65535: 131072} {
		if got := replaySpan(window); got != want {
			t.Fatalf("replaySpan(%d) = %d, want %d", window, got, want)
		}
	}
	for s := uint32(0); s < 1000; s++ {
		if !w.take(s) {
			t.Fatalf("%d in order taken for a duplicate", s)
		}
		if w.take(s) {
			t.Fatalf("%d again taken for new", s)
		}
		if s > 0 && w.take(s-1) {
			t.Fatalf("%d again, after %d, taken for new", s-1, s)
		}
	}
	// Numbers before the first count as seen, and so does anything older
	// than the window; a jump of 2^31 or more counts as behind.
	if w := newReplayWindow(1); w.take(^uint32(0)) || w.take(1<<31) {
		t.Fatal("number -1 or 2^31 taken for new on a fresh window")
	}
	if w.take(999-128) || w.take(0) {
		t.Fatal("a number older than the window taken for new")
	}
	// A gap: the numbers skipped stay new until they come.
	if !w.take(1010) || !w.take(1005) || w.take(1005) || !w.take(1000) {
		t.Fatal("numbers skipped over not taken once each")
	}
	// Across the wrap of the counter.
	checkReplay(t, 32, ^uint32(0)-100, func() []uint32 {
		var seqs []uint32
		for s := ^uint32(0) - 100; s != 100; s++ {
			seqs = append(seqs, s, s-3)
		}
		return seqs
	}())

	// Random streams as a sender makes them (Conn.spanFullLocked): at most
	// window messages outstanding, none numbered a span or more ahead of
	// an outstanding one; outstanding messages arrive in any order, some
	// twice (a resend across a recovery). Every number must be taken
	// exactly once.
	rng := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 300; round++ {
		window := 1 + rng.IntN(80)
		span := replaySpan(window)
		var seqs, in []uint32
		for n := uint32(0); n < 1000 || len(in) > 0; {
			if n < 1000 && len(in) < window && (len(in) == 0 || n-in[0] < span) && (len(in) == 0 || rng.IntN(2) == 0) {
				in = append(in, n)
				n++
				continue
			}
			j := rng.IntN(len(in))
			seqs = append(seqs, in[j])
			if rng.IntN(10) != 0 { // else it is sent again later
				in = append(in[:j], in[j+1:]...)
			}
		}
		w := newReplayWindow(window)
		taken := map[uint32]int{}
		for _, s := range seqs {
			if w.take(s) {
				taken[s]++
			}
		}
		for s := uint32(0); s < 1000; s++ {
			if taken[s] != 1 {
				t.Fatalf("round %d, window %d: number %d taken %d times", round, window, s, taken[s])
			}
		}
		checkReplay(t, window, 0, seqs)
	}
}

// FuzzReplayWindow feeds hostile sequence numbers (a peer may send any):
// the window must agree with its specification, whatever comes.
func FuzzReplayWindow(f *testing.F) {
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0}, uint8(2))
	f.Add([]byte{0x7f, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}, uint8(64))
	f.Add([]byte{0, 0, 0, 200, 0, 0, 0, 100, 0, 0, 0, 150}, uint8(128))
	f.Fuzz(func(t *testing.T, b []byte, window uint8) {
		var seqs []uint32
		for ; len(b) >= 4; b = b[4:] {
			seqs = append(seqs, binary.BigEndian.Uint32(b))
		}
		checkReplay(t, int(window), 0, seqs)
	})
}
