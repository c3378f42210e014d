package xrc

import (
	crand "crypto/rand"
	"math/rand/v2"
)

// tagSource makes the tags that name legs: a sender's conn tag (with its
// incarnation, the key the acceptor knows a leg by) and a receiver's tag
// (the immediate data of every message on the leg). They are random, not
// counted: a REQ that names a leg (a MOVE, a retransmission answered from
// the cache) is believed from any process of the sender's node, so a leg's
// tags must not be guessable from others, such as the one a process gets
// back when it dials the same peer (found by a review: with counted tags a
// process on the sender's node could move another process's leg onto its
// own INI). A tag is never one in use (the caller's inUse), nor one of the
// last retiredMax released, which an acceptor may still remember (its
// retired legs) or a message in flight may still carry.
type tagSource struct {
	rng    *rand.ChaCha8
	recent recent[uint32]
	first  []uint32 // tests: drawn before rng's
}

func newTagSource() tagSource {
	var seed [32]byte
	crand.Read(seed[:])
	return tagSource{rng: rand.NewChaCha8(seed)}
}

func (s *tagSource) next(inUse func(uint32) bool) uint32 {
	for {
		t := uint32(s.rng.Uint64())
		if len(s.first) > 0 {
			t, s.first = s.first[0], s.first[1:]
		}
		if t != 0 && !inUse(t) && !s.recent.has(t) {
			return t
		}
	}
}

// release keeps t from reuse for the next retiredMax releases.
func (s *tagSource) release(t uint32) { s.recent.add(t) }

// recent is a set of the last retiredMax keys added.
type recent[K comparable] struct {
	set  map[K]struct{}
	ring []K
	next int
}

const retiredMax = 4096

func (r *recent[K]) add(k K) {
	if r.set == nil {
		r.set = make(map[K]struct{})
	}
	if _, ok := r.set[k]; ok {
		return
	}
	if len(r.ring) < retiredMax {
		r.ring = append(r.ring, k)
	} else {
		delete(r.set, r.ring[r.next])
		r.ring[r.next] = k
		r.next = (r.next + 1) % retiredMax
	}
	r.set[k] = struct{}{}
}

func (r *recent[K]) has(k K) bool {
	_, ok := r.set[k]
	return ok
}
