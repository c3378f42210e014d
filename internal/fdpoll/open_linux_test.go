package fdpoll

import (
	"context"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// A descriptor epoll refuses (a regular file) was taken by Open, which
// left it unregistered, and every Wait that had to sleep failed with the
// os package's "waiting for unsupported file type" (or, with a deadline,
// "file type does not support deadline"): neither ErrClosed nor ctx's
// error, nor naming the descriptor. Open now says so itself.
func TestOpenRefusesUnpollable(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "regular")
	require.NoError(t, err)
	defer f.Close()
	fd := int(f.Fd())
	before := openFDs(t)
	p, err := Open(fd, "regular file")
	if err == nil {
		err = p.Wait(context.Background(), func() bool { return false })
		p.Close()
		t.Fatalf("Open took a descriptor it cannot poll; Wait then said %q", err)
	}
	require.ErrorIs(t, err, os.ErrNoDeadline)
	require.Contains(t, err.Error(), "regular file")
	require.Equal(t, before, openFDs(t), "the duplicate is not left open")
	_, err = unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	require.NoError(t, err, "the caller's descriptor stays open")
}

// openFDs counts this process's open descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}
