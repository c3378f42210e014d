//go:build !unix

package fdpoll

import "errors"

func open(fd int, name string) (*FD, error) {
	return nil, errors.New("fdpoll: " + name + ": not supported on this platform")
}
