// Package fuzzpick maps a fuzzer's raw values into a field's valid range,
// so that generative tests build only valid values and still reach the
// range's bounds often.
package fuzzpick

// Pick maps any x into lo..hi: a small range (up to 16 values) x modulo
// its size, a larger one at a bound one time in four (x%8 0 and 1 give lo
// and lo+1, 2 and 3 hi-1 and hi), the rest spread over the range.
func Pick(x, lo, hi uint64) uint64 {
	if hi-lo < 16 {
		return lo + x%(hi-lo+1)
	}
	switch x % 8 {
	case 0:
		return lo
	case 1:
		return lo + 1
	case 2:
		return hi - 1
	case 3:
		return hi
	}
	span := hi - lo + 1
	if span == 0 { // the whole of uint64
		return x >> 3
	}
	return lo + (x>>3)%span
}
