package real

// sendRing hands out an INI's registered send memory as a ring. A message
// takes the next n bytes, skipping the tail of the memory when it does not
// fit there; completions, which come in posting order, give the bytes back.
// Pure bookkeeping, so that it is tested without a device.
type sendRing struct {
	size int    // bytes of send memory
	head int    // next free byte
	used int    // bytes in flight, skipped tails included
	out  []span // posted, not completed: out[outHead:], in posting order
	// outHead is the first span of out still in flight; out is compacted
	// once most of it is done, so that it neither grows nor allocates.
	outHead int
}

type span struct {
	wrid         uint64
	off, n, size int // size includes any skipped tail of the ring
}

// place finds room for n bytes after the spans already placed by this
// chain, which leave the ring at head with used bytes in flight; ok is
// false when they do not fit.
func (r *sendRing) place(head, used int, wrid uint64, n int) (s span, ok bool) {
	s = span{wrid: wrid, off: head, n: n, size: n}
	if head+n > r.size { // skip the tail
		s.size += r.size - head
		s.off = 0
	}
	if used+s.size > r.size {
		return span{}, false
	}
	return s, true
}

// next is where a chain's following message goes after s: the new head and
// bytes in flight.
func (r *sendRing) next(s span, used int) (head, newUsed int) {
	return (s.off + s.n) % r.size, used + s.size
}

// commit records posted spans as in flight.
func (r *sendRing) commit(spans []span) {
	for _, s := range spans {
		r.out = append(r.out, s)
		r.head, r.used = r.next(s, r.used)
	}
}

// release gives back the memory of the span of wrid and of every span
// posted before it (their completions are implied: unsignaled, or reported
// first).
func (r *sendRing) release(wrid uint64) {
	for i := r.outHead; i < len(r.out); i++ {
		if r.out[i].wrid != wrid {
			continue
		}
		for _, t := range r.out[r.outHead : i+1] {
			r.used -= t.size
		}
		r.outHead = i + 1
		switch {
		case r.outHead == len(r.out):
			r.out, r.outHead = r.out[:0], 0
			r.used, r.head = 0, 0
		case r.outHead > len(r.out)/2:
			r.out = r.out[:copy(r.out, r.out[r.outHead:])]
			r.outHead = 0
		}
		return
	}
}
