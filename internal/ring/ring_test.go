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
