//go:build unix

package fdpoll

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

func open(fd int, name string) (*FD, error) {
	if err := unix.SetNonblock(fd, true); err != nil {
		return nil, fmt.Errorf("fdpoll: set %s non-blocking: %w", name, err)
	}
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("fdpoll: dup %s: %w", name, err)
	}
	// os.NewFile registers a non-blocking descriptor with the netpoller.
	f := os.NewFile(uintptr(dup), name)
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("fdpoll: %s: %w", name, err)
	}
	return &FD{file: f, rc: rc}, nil
}
