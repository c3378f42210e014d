package ring

import "testing"

func TestRingFIFOAcrossTheWrap(t *testing.T) {
	r := Make[int](3)
	next, want := 0, 0
	for round := range 10 {
		for r.Len() < r.Cap() {
			r.Push(next)
			next++
		}
		if round%2 == 0 {
			r.DropLast() // taken back: never popped
			next--
		}
		for i := range r.Len() {
			if got := *r.At(i); got != want+i {
				t.Fatalf("round %d: At(%d) %d, want %d", round, i, got, want+i)
			}
		}
		for r.Len() > 1 {
			if got := r.Peek(); got != want {
				t.Fatalf("round %d: peek %d, want %d", round, got, want)
			}
			if got := r.Pop(); got != want {
				t.Fatalf("round %d: pop %d, want %d", round, got, want)
			}
			want++
		}
	}
	if r.Len() != 1 || r.Pop() != want {
		t.Fatalf("the last value is not %d", want)
	}
}

func TestRingPopClearsItsSlot(t *testing.T) {
	r := Make[*int](2)
	v := new(int)
	r.Push(v)
	if r.Pop() != v {
		t.Fatal("popped another value")
	}
	if r.buf[0] != nil {
		t.Fatal("the ring still refers to a popped value")
	}
	r.Push(v)
	r.DropLast()
	if r.Len() != 0 || r.buf[1] != nil {
		t.Fatal("the ring still refers to a value taken back")
	}
	r.Push(v)
	w := new(int)
	*r.At(0) = w // At is in place
	if r.Pop() != w {
		t.Fatal("At gave a copy")
	}
}

// Grow keeps the values in order, also when they wrap the old buffer, and
// never shrinks a ring.
func TestRingGrowKeepsOrder(t *testing.T) {
	var r Ring[int]
	r.Grow(2)
	r.Push(0)
	r.Push(1)
	r.Pop()
	r.Push(2) // wraps: head 1
	r.Grow(5)
	r.Push(3)
	r.Push(4)
	r.Grow(3) // no shrink
	if r.Cap() != 5 || r.Len() != 4 {
		t.Fatalf("cap %d len %d, want 5 and 4", r.Cap(), r.Len())
	}
	for want := 1; want <= 4; want++ {
		if got := r.Pop(); got != want {
			t.Fatalf("pop %d, want %d", got, want)
		}
	}
}
