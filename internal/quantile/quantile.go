// Package quantile computes the order statistics that the examples and the
// benchmark tools report, one way for all of them: a median as perftest's
// (the mean of the two middle values of an even count) and percentiles by
// nearest rank.
package quantile

import "slices"

// Number is what the statistics are taken of: durations, counts, rates.
type Number interface{ ~int64 | ~float64 }

// Median sorts s and returns its middle value, or the mean of its two
// middle values when len(s) is even; 0 for an empty s.
func Median[T Number](s []T) T {
	n := len(s)
	if n == 0 {
		return 0
	}
	slices.Sort(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return s[n/2-1] + (s[n/2]-s[n/2-1])/2
}

// Rank sorts s and returns its p-th percentile by nearest rank: the
// smallest value that at least p percent of s are no greater than
// (p in 1..100; p 99 of 100 values is the 99th smallest). 0 for an empty s.
func Rank[T Number](s []T, p int) T {
	n := len(s)
	if n == 0 {
		return 0
	}
	slices.Sort(s)
	i := (n*p+99)/100 - 1
	return s[min(max(i, 0), n-1)]
}
