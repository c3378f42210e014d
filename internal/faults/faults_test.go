package faults

import (
	"errors"
	"testing"
)

func TestFailOnce(t *testing.T) {
	if Check("op") != nil {
		t.Fatal("a call failed with no hook set")
	}
	boom := errors.New("boom")
	unset := Set(FailOnce("op", boom))
	if Check("other") != nil {
		t.Fatal("another call failed")
	}
	if Check("op") != boom {
		t.Fatal("the named call did not fail")
	}
	if Check("op") != nil {
		t.Fatal("the named call failed twice")
	}
	unset()
	Set(FailOnce("op", boom))
	Set(nil)
	if Check("op") != nil {
		t.Fatal("a removed hook still failed calls")
	}
}

// An unset removes only the hook it set: it removed whatever was set, so
// an earlier hook's cleanup cleared a later one.
func TestUnsetLeavesALaterHook(t *testing.T) {
	e := errors.New("injected")
	unsetA := Set(FailOnce("a", e))
	unsetB := Set(FailOnce("b", e))
	defer unsetB()
	unsetA()
	if err := Check("b"); !errors.Is(err, e) {
		t.Fatalf("the later hook: %v, want %v", err, e)
	}
}
