package real

import (
	"math/rand/v2"
	"testing"
)

func TestSendRingWrapsAndRefuses(t *testing.T) {
	r := sendRing{size: 100}
	place := func(wrid uint64, n int) (span, bool) {
		s, ok := r.place(r.head, r.used, wrid, n)
		if ok {
			r.commit([]span{s})
		}
		return s, ok
	}
	a, _ := place(1, 40)
	b, _ := place(2, 40)
	if a.off != 0 || b.off != 40 || r.head != 80 || r.used != 80 {
		t.Fatalf("a %+v b %+v head %d used %d", a, b, r.head, r.used)
	}
	if _, ok := place(3, 30); ok {
		t.Fatal("30 bytes placed with 20 left at the tail and none free at the start")
	}
	r.release(1)
	c, ok := place(3, 30)
	if !ok || c.off != 0 || c.size != 50 {
		t.Fatalf("after a's completion: %+v %v, want offset 0 with the 20-byte tail skipped", c, ok)
	}
	if _, ok := place(4, 11); ok {
		t.Fatal("11 bytes placed where 10 were free")
	}
	r.release(3) // b's completion is implied: it was posted first
	if r.used != 0 || r.head != 0 || len(r.out) != 0 {
		t.Fatalf("all complete: head %d used %d out %v", r.head, r.used, r.out)
	}
	if _, ok := place(5, 101); ok {
		t.Fatal("a message larger than the ring was placed")
	}
	if s, ok := place(5, 100); !ok || s.off != 0 {
		t.Fatalf("a message of the ring's size in an empty ring: %+v %v", s, ok)
	}
}

// TestSendRingNeverOverlaps drives the ring with random chains and
// completions and checks, byte by byte, that no message is placed over one
// still in flight, that the bytes counted in flight are those of the
// messages not completed (skipped tails included), and that the accounting
// returns to empty.
func TestSendRingNeverOverlaps(t *testing.T) {
	const size = 1000
	rng := rand.New(rand.NewPCG(1, 2))
	r := sendRing{size: size}
	var owner [size]uint64 // wrid whose message holds each byte; 0: free
	var inFlight []span
	next := uint64(1)
	for step := range 20000 {
		if len(inFlight) > 0 && rng.IntN(3) == 0 {
			// Complete up to a random in-flight message, in order.
			k := rng.IntN(len(inFlight))
			r.release(inFlight[k].wrid)
			for _, s := range inFlight[:k+1] {
				for i := s.off; i < s.off+s.n; i++ {
					owner[i] = 0
				}
			}
			inFlight = inFlight[k+1:]
			continue
		}
		// A chain of one to three messages.
		head, used := r.head, r.used
		var chain []span
		for range 1 + rng.IntN(3) {
			n := rng.IntN(300)
			s, ok := r.place(head, used, next, n)
			if !ok {
				if used == 0 && n <= size {
					t.Fatalf("step %d: %d bytes refused by an empty ring", step, n)
				}
				break
			}
			for i := s.off; i < s.off+s.n; i++ {
				if owner[i] != 0 {
					t.Fatalf("step %d: message %d placed at [%d,%d) over message %d", step, next, s.off, s.off+s.n, owner[i])
				}
			}
			for i := s.off; i < s.off+s.n; i++ {
				owner[i] = next
			}
			chain = append(chain, s)
			head, used = r.next(s, used)
			next++
		}
		r.commit(chain)
		inFlight = append(inFlight, chain...)
		if r.head != head || r.used != used {
			t.Fatalf("step %d: committed state head %d used %d, placed %d %d", step, r.head, r.used, head, used)
		}
		sum := 0
		for _, s := range inFlight {
			sum += s.size
		}
		if r.used != sum || r.used > size {
			t.Fatalf("step %d: %d bytes counted in flight, the messages hold %d (ring of %d)", step, r.used, sum, size)
		}
	}
	if len(inFlight) > 0 {
		r.release(inFlight[len(inFlight)-1].wrid)
	}
	if r.used != 0 || r.head != 0 || len(r.out) != 0 {
		t.Fatalf("all complete: head %d used %d, %d spans", r.head, r.used, len(r.out))
	}
}
