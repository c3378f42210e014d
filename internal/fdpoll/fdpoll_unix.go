//go:build unix

package fdpoll

import (
	"fmt"
	"os"
	"time"

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
	// It registers none that epoll refuses (a regular file), and says
	// nothing: every Wait that had to sleep would fail with an error of
	// the os package's. A deadline is refused then, so say it here.
	if err := f.SetReadDeadline(time.Time{}); err != nil {
		f.Close()
		return nil, fmt.Errorf("fdpoll: %s cannot be polled: %w", name, err)
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("fdpoll: %s: %w", name, err)
	}
	return &FD{file: f, rc: rc}, nil
}
