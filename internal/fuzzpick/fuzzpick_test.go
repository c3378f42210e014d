package fuzzpick

import (
	"math"
	"testing"
)

func TestPick(t *testing.T) {
	for _, r := range [][2]uint64{{0, 0}, {3, 9}, {1, 1 << 24}, {64, 1 << 20}, {0, math.MaxUint64}, {1, math.MaxUint64}} {
		lo, hi := r[0], r[1]
		seen := map[uint64]bool{}
		for x := range uint64(4096) {
			v := Pick(x*0x9e3779b97f4a7c15, lo, hi)
			if v < lo || v > hi {
				t.Fatalf("Pick(_, %d, %d) = %d: out of range", lo, hi, v)
			}
			seen[v] = true
		}
		for _, b := range []uint64{lo, hi} {
			if !seen[b] {
				t.Errorf("Pick(_, %d, %d) never gave the bound %d", lo, hi, b)
			}
		}
	}
}
