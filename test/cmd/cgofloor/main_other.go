//go:build !linux || !cgo

package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Fprintln(os.Stderr, "cgofloor: needs Linux and cgo (librdmacm and libibverbs)")
	os.Exit(1)
}
