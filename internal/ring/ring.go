// Package ring is a bounded FIFO for data paths: made at its largest size
// (or grown to it as it fills: Grow), so that queueing does not allocate.
package ring

// Ring holds up to its capacity of T in insertion order. The zero Ring has
// capacity 0; make one with Make. It is not safe for concurrent use.
type Ring[T any] struct {
	buf     []T
	head, n int
}

// Make returns an empty ring that holds up to capacity values.
func Make[T any](capacity int) Ring[T] { return Ring[T]{buf: make([]T, capacity)} }

// Grow raises the ring's capacity to capacity if it is less, keeping its
// values in order: for a ring whose bound is set by a peer, grown as it
// fills rather than made at the bound.
func (r *Ring[T]) Grow(capacity int) {
	if capacity <= len(r.buf) {
		return
	}
	buf := make([]T, capacity)
	for i := range r.n {
		buf[i] = *r.At(i)
	}
	r.buf, r.head = buf, 0
}

// Len is the number of values held.
func (r *Ring[T]) Len() int { return r.n }

// Cap is the most the ring holds.
func (r *Ring[T]) Cap() int { return len(r.buf) }

// Push appends v; the caller has checked that Len < Cap.
func (r *Ring[T]) Push(v T) {
	r.buf[(r.head+r.n)%len(r.buf)] = v
	r.n++
}

// Peek returns the oldest value, which must exist.
func (r *Ring[T]) Peek() T { return r.buf[r.head] }

// At returns the i-th oldest value (0 <= i < Len), in place.
func (r *Ring[T]) At(i int) *T { return &r.buf[(r.head+i)%len(r.buf)] }

// Pop removes and returns the oldest value, which must exist; its slot is
// cleared so that the ring does not keep what it referred to.
func (r *Ring[T]) Pop() T {
	var zero T
	v := r.buf[r.head]
	r.buf[r.head] = zero
	r.head = (r.head + 1) % len(r.buf)
	r.n--
	return v
}

// DropLast takes back the most recent Push, clearing its slot.
func (r *Ring[T]) DropLast() {
	var zero T
	r.n--
	r.buf[(r.head+r.n)%len(r.buf)] = zero
}
