//go:build race

package testenv

// RaceEnabled reports whether the race detector is built in. Allocation
// counts mean little under it: it allocates on its own account, and
// sync.Pool drops a share of what it is given on purpose.
const RaceEnabled = true
