package main

import (
	"math"
	"testing"
)

// A bandwidth run checks the sink's report against count x size, which a
// 32-bit int overflowed past 2 GiB (-size 65536 -count 32768): the run
// failed ("server received "32768 2147483648", want "32768 -2147483648""),
// all its bytes received, on a 32-bit client or against a 32-bit server
// (its sink counted in an int too). Both count in 64 bits.
func TestSinkReport64(t *testing.T) {
	for _, tc := range []struct {
		count, size int
		want        string
	}{
		{2000, 65536, "2000 131072000"},
		{32768, 65536, "32768 2147483648"},
		{2049, 1 << 20, "2049 2148532224"},
		{math.MaxInt32, 1 << 30, "2147483647 2305843008139952128"},
		{5, 0, "5 0"},
	} {
		if got := sinkReport(tc.count, tc.size); got != tc.want {
			t.Errorf("sinkReport(%d, %d) = %q, want %q", tc.count, tc.size, got, tc.want)
		}
	}
}
