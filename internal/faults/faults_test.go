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
