package quantile

import (
	"testing"
	"time"
)

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		in   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{7}, 7},
		{[]float64{9, 1}, 5},
		{[]float64{3, 1, 2}, 2},
		{[]float64{4, 1, 3, 2}, 2.5},
	} {
		if got := Median(tc.in); got != tc.want {
			t.Errorf("Median(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
	// Durations: the mean of the middle two, without overflow near the top.
	if got := Median([]time.Duration{1<<62 + 2, 1<<62 + 4}); got != 1<<62+3 {
		t.Errorf("Median of two large durations = %d", got)
	}
}

func TestRank(t *testing.T) {
	hundred := make([]int64, 100)
	for i := range hundred {
		hundred[99-i] = int64(i + 1) // 100..1, unsorted
	}
	for _, tc := range []struct {
		s    []int64
		p    int
		want int64
	}{
		{hundred, 99, 99}, // not the maximum
		{hundred, 100, 100},
		{hundred, 50, 50},
		{hundred, 1, 1},
		{[]int64{5}, 99, 5},
		{[]int64{1, 2}, 99, 2},
		{[]int64{1, 2}, 50, 1},
		{nil, 99, 0},
	} {
		if got := Rank(append([]int64(nil), tc.s...), tc.p); got != tc.want {
			t.Errorf("Rank(%d values, %d) = %d, want %d", len(tc.s), tc.p, got, tc.want)
		}
	}
	thousand := make([]int64, 1000)
	for i := range thousand {
		thousand[i] = int64(i + 1)
	}
	if got := Rank(thousand, 99); got != 990 {
		t.Errorf("p99 of 1..1000 = %d, want 990", got)
	}
}
