package kernel

import "testing"

type fakeKernel struct{ Kernel }

type box struct{ k Kernel }

func TestUnwrap(t *testing.T) {
	if _, ok := Unwrap(&box{}); ok {
		t.Fatal("unwrapped before registration")
	}
	k := fakeKernel{}
	RegisterUnwrapper(func(v any) (Kernel, bool) {
		b, ok := v.(*box)
		if !ok {
			return nil, false
		}
		return b.k, true
	})
	if got, ok := Unwrap(&box{k: k}); !ok || got != Kernel(k) {
		t.Fatalf("Unwrap = %v, %v", got, ok)
	}
	if _, ok := Unwrap(&box{}); ok {
		t.Fatal("a box without a kernel unwrapped")
	}
	if _, ok := Unwrap(42); ok {
		t.Fatal("an int unwrapped")
	}
	if _, ok := Unwrap(nil); ok {
		t.Fatal("nil unwrapped")
	}
}
