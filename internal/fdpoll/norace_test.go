//go:build !race

package fdpoll

const raceEnabled = false
