//go:build !linux || !cgo

package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "setupfloor: needs Linux and cgo (librdmacm)")
	os.Exit(1)
}
