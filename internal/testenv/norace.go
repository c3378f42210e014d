//go:build !race

package testenv

// RaceEnabled reports whether the race detector is built in (see race.go).
const RaceEnabled = false
