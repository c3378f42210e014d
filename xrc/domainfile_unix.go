//go:build unix

package xrc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

func openDomainFile(ctx context.Context, dir string) (DomainFile, error) {
	d, f, err := openDomain(ctx, dir)
	if f != nil {
		f.Close()
	}
	return d, err
}

// domainFD names the open file f (a checked domain file) for a kernel that
// opens domain files by path: on Linux, the open file itself (its magic
// link in /proc), not its path again, which a writer of a parent directory
// may have pointed elsewhere since the file was checked. Elsewhere (no XRC
// there, only the in-memory fabric) its path.
func domainFD(f *os.File) string {
	if runtime.GOOS == "linux" {
		return fmt.Sprintf("/proc/self/fd/%d", f.Fd())
	}
	return f.Name()
}

// openDomain is openDomainFile that also returns the domain file it
// checked and read, open, for the caller to close (nil with an error).
func openDomain(ctx context.Context, dir string) (_ DomainFile, _ *os.File, err error) {
	if dir == "" {
		// Clean would make it ".": the working directory, which is no
		// domain directory anyone named.
		return DomainFile{}, nil, fmt.Errorf("%w: no directory named", ErrDomainFile)
	}
	// A trailing "/" or "/." makes the kernel follow a symbolic link in
	// the last component despite O_NOFOLLOW.
	dir = filepath.Clean(dir)
	newDir, err := mkdirAll(dir)
	if err != nil {
		if _, lerr := os.Lstat(dir); lerr == nil {
			// Something else is in its place: a dangling symbolic link
			// (planted in /tmp, say) or a file.
			return DomainFile{}, nil, fmt.Errorf("%w: %s: %w (it must be a directory, not a symbolic link)", ErrDomainFile, dir, err)
		}
		return DomainFile{}, nil, err
	}
	// The directory and the file are the domain's only access control, and
	// the default directory has a predictable name in /tmp: neither may be
	// a symbolic link, another user's, or open to others.
	dfd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return DomainFile{}, nil, openErr(dir, err, "a directory")
	}
	d := os.NewFile(uintptr(dfd), dir)
	defer d.Close()
	if err := checkOwned(d, dir, true); err != nil {
		return DomainFile{}, nil, err
	}
	if newDir {
		// A umask that takes the owner's bits (0177, 0277) made it 0600 or
		// 0500: no domain file could be made in it, by us or later. Where
		// the file system refuses the chmod, the file's open says why.
		unix.Fchmod(dfd, 0o700)
	}
	// One lock for create-or-read: a reader never sees a half-written file.
	if err := lockDir(ctx, d, dir); err != nil {
		return DomainFile{}, nil, err
	}
	defer flock(d, syscall.LOCK_UN)

	path := domainPath(dir)
	// Read-only until it must be written: a file we may read but not write
	// (mode 0400, immutable, a read-only mount) names the domain as well.
	f, err := openDomainAt(dfd, path, unix.O_RDONLY)
	made := errors.Is(err, unix.ENOENT)
	if made {
		// Writable as made: its mode (0600 less the umask) may not let
		// us open it for writing again.
		f, err = openDomainAt(dfd, path, unix.O_RDWR|unix.O_CREAT|unix.O_EXCL)
	}
	if err != nil {
		return DomainFile{}, nil, err
	}
	defer func() {
		if err != nil {
			f.Close()
		}
	}()
	b, err := io.ReadAll(io.LimitReader(f, 64))
	if err != nil {
		return DomainFile{}, nil, err
	}
	if len(b) == 0 {
		// Just made, or its creator died between create and write (we
		// hold the lock, so it is not writing now): nobody can have used
		// an id that was never written, so write one.
		if !made {
			f.Close()
			if f, err = openDomainAt(dfd, path, unix.O_RDWR); err != nil {
				return DomainFile{}, nil, err
			}
		}
		dom, err := writeDomainID(f, path)
		if err != nil {
			return DomainFile{}, nil, err
		}
		return dom, f, nil
	}
	id, ok := parseDomainID(b)
	if !ok {
		return DomainFile{}, nil, fmt.Errorf("%w: %s: unreadable content (remove the file once no process uses the domain)", ErrDomainFile, path)
	}
	return DomainFile{Path: path, ID: id}, f, nil
}

// mkdirAll is os.MkdirAll(dir, 0o700) that says whether it made dir, and
// sets the parents it makes 0700: a umask that takes the owner's bits
// (0177, 0277) made them 0600 or 0500, dir could not be made in them, and
// they stayed, refusing every later process. dir itself is set 0700 by
// the caller, after its checks.
func mkdirAll(dir string) (made bool, err error) {
	if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
		return false, os.MkdirAll(dir, 0o700)
	}
	if parent := filepath.Dir(dir); parent != dir {
		parentMade, err := mkdirAll(parent)
		if err != nil {
			return false, err
		}
		if parentMade {
			// Through O_NOFOLLOW, as dir's own; where it fails, dir's
			// mkdir says why.
			if fd, err := unix.Open(parent, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err == nil {
				unix.Fchmod(fd, 0o700)
				unix.Close(fd)
			}
		}
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		// Made meanwhile (another process's), or something else is
		// there: as MkdirAll says.
		return false, os.MkdirAll(dir, 0o700)
	}
	return true, nil
}

// openDomainAt opens the domain file in the directory dfd and checks it,
// whether it was there or has just been made: a file system may not make
// it as asked (another owner or mode), and then later processes refuse it.
func openDomainAt(dfd int, path string, flags int) (*os.File, error) {
	fd, err := unix.Openat(dfd, DomainFileName, flags|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, openErr(path, err, "a regular file")
	}
	f := os.NewFile(uintptr(fd), path)
	if err := checkOwned(f, path, false); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// openErr reports a failed open of the domain directory or file (what it
// must be): O_NOFOLLOW refuses a symbolic link with ELOOP, but with ENOTDIR
// where O_DIRECTORY asks for a directory (the directory's open), so Lstat
// says whether it was one; other errnos (EACCES, EPERM, EROFS) say what
// they mean themselves.
func openErr(name string, err error, what string) error {
	var st unix.Stat_t
	lerr := unix.Lstat(name, &st)
	if err == unix.ELOOP || lerr == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return fmt.Errorf("%w: %s: %w (it must be %s, not a symbolic link)", ErrDomainFile, name, err, what)
	}
	// Another user's (a /tmp/goxrc-<uid> made by someone else) is closed
	// to us more often than not: say whose, which we cannot change.
	if err == unix.EACCES && lerr == nil && int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("%w (%w)", notOurs(name, st.Uid), err)
	}
	return fmt.Errorf("%w: %s: %w", ErrDomainFile, name, err)
}

// checkOwned refuses a domain directory (dir) or file that is not ours, is
// open to group or others, or is not what it should be (a directory; a
// regular file with one link).
func checkOwned(f *os.File, name string, dir bool) error {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return &os.PathError{Op: "fstat", Path: name, Err: err}
	}
	kind, want := st.Mode&unix.S_IFMT, uint32(unix.S_IFREG)
	what := "a regular file of mode 0600 with one link"
	if dir {
		want, what = unix.S_IFDIR, "a directory of mode 0700"
	}
	// The owner first: another user's mode is not ours to fix.
	switch {
	case int(st.Uid) != os.Geteuid():
		return notOurs(name, st.Uid)
	case uint32(kind) != want || st.Mode&0o077 != 0 || (!dir && uint64(st.Nlink) != 1):
		return fmt.Errorf("%w: %s: mode %#o, %d links: want %s", ErrDomainFile, name, st.Mode, st.Nlink, what)
	}
	return nil
}

// notOurs refuses name, of user uid, saying what to do instead.
func notOurs(name string, uid uint32) error {
	return fmt.Errorf("%w: %s: owned by uid %d, not by this process's (%d): use a domain directory of your own (xrc.Config.DomainDir, cm.WithDomainPath), or have the other user (or root) remove this one", ErrDomainFile, name, uid, os.Geteuid())
}

func writeDomainID(f *os.File, path string) (DomainFile, error) {
	id, err := newDomainID()
	if err != nil {
		return DomainFile{}, err
	}
	if _, err := f.WriteAt(formatDomainID(id), 0); err != nil {
		return DomainFile{}, err
	}
	if err := f.Sync(); err != nil {
		return DomainFile{}, err
	}
	return DomainFile{Path: path, ID: id}, nil
}

// lockDir takes d's exclusive lock, waiting until ctx ends. It polls with
// LOCK_NB: a blocking flock cannot be interrupted, and another process of
// the user (a stopped one, say) may hold the lock for ever.
func lockDir(ctx context.Context, d *os.File, dir string) error {
	for wait := time.Millisecond; ; wait = min(2*wait, 20*time.Millisecond) {
		err := flock(d, syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return nil
		}
		if err != syscall.EWOULDBLOCK {
			// ENOLCK, EOPNOTSUPP: a file system without flock (NFS,
			// some FUSE ones) cannot make the domain file safely.
			return fmt.Errorf("%w: %s: flock: %w (the domain directory must be on a file system with flock(2) locks: set xrc.Config.DomainDir or cm.WithDomainPath to a local one)", ErrDomainFile, dir, err)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("xrc: waiting for the lock of domain directory %s, which another process holds: %w", dir, ctx.Err())
		case <-t.C:
		}
	}
}

func flock(f *os.File, how int) error {
	for {
		err := syscall.Flock(int(f.Fd()), how)
		if err != syscall.EINTR {
			return err
		}
	}
}
