//go:build unix

package xrc

import (
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"
)

func openDomainFile(dir string) (DomainFile, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return DomainFile{}, err
	}
	d, err := os.Open(dir)
	if err != nil {
		return DomainFile{}, err
	}
	defer d.Close()
	fi, err := d.Stat()
	if err != nil {
		return DomainFile{}, err
	}
	if !fi.IsDir() || fi.Mode().Perm()&0o077 != 0 {
		return DomainFile{}, fmt.Errorf("%w: %s: mode %v, want a directory of mode 0700", ErrDomainFile, dir, fi.Mode())
	}
	// One lock for create-or-read: a reader never sees a half-written file.
	if err := flock(d, syscall.LOCK_EX); err != nil {
		return DomainFile{}, &os.PathError{Op: "flock", Path: dir, Err: err}
	}
	defer flock(d, syscall.LOCK_UN)

	path := domainPath(dir)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err == nil {
		defer f.Close()
		return writeDomainID(f, path)
	}
	if !errors.Is(err, os.ErrExist) {
		return DomainFile{}, err
	}
	f, err = os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return DomainFile{}, err
	}
	defer f.Close()
	fi, err = f.Stat()
	if err != nil {
		return DomainFile{}, err
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o077 != 0 {
		return DomainFile{}, fmt.Errorf("%w: %s: mode %v, want a regular file of mode 0600", ErrDomainFile, path, fi.Mode())
	}
	b, err := io.ReadAll(io.LimitReader(f, 64))
	if err != nil {
		return DomainFile{}, err
	}
	if len(b) == 0 {
		// A creator died between create and write (we hold the lock, so it
		// is not writing now); nobody can have used an id that was never
		// written, so write one.
		return writeDomainID(f, path)
	}
	id, ok := parseDomainID(b)
	if !ok {
		return DomainFile{}, fmt.Errorf("%w: %s: unreadable content", ErrDomainFile, path)
	}
	return DomainFile{Path: path, ID: id}, nil
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

func flock(f *os.File, how int) error {
	for {
		err := syscall.Flock(int(f.Fd()), how)
		if err != syscall.EINTR {
			return err
		}
	}
}
