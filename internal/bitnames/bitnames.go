// Package bitnames prints flag sets by name, for the String methods of the
// bindings' and cm's mask types: one format for all of them.
package bitnames

import (
	"fmt"
	"strings"
)

// Bit names one bit (or one group of bits) of a flag set.
type Bit struct {
	Mask uint64
	Name string
}

// Join joins the names of v's known bits with "|", in the order of names,
// with any bits left unnamed last in hex; 0 prints as "0".
func Join(v uint64, names []Bit) string {
	if v == 0 {
		return "0"
	}
	var parts []string
	for _, n := range names {
		if v&n.Mask != 0 {
			parts = append(parts, n.Name)
			v &^= n.Mask
		}
	}
	if v != 0 {
		parts = append(parts, fmt.Sprintf("%#x", v))
	}
	return strings.Join(parts, "|")
}
