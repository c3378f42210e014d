package xrc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/goxrc/goxrc/xrc/memfabric"
)

// A domain file that the process may read but not write (immutable here; of
// mode 0400, or on a read-only mount, likewise) names the domain as well as
// a writable one: only an empty file is written. It was opened O_RDWR and
// refused. The endpoint opens its XRCD through the file (read-only, as the
// kernel side opens it) as well.
func TestOpenDomainFileReadOnlyToUs(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "goxrc")
	d1, err := OpenDomainFile(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	setImmutable(t, d1.Path)
	if d2, err := OpenDomainFile(context.Background(), dir); err != nil || d2 != d1 {
		t.Fatalf("immutable file: %+v %v, want %+v", d2, err, d1)
	}
	if err := endpointOn(dir, d1.ID); err != nil {
		t.Fatalf("immutable file: %v", err)
	}
}

// endpointOn opens the domain file in dir, which must hold domain id want,
// then an endpoint on it.
func endpointOn(dir string, want uint64) error {
	d, err := OpenDomainFile(context.Background(), dir)
	if err != nil || d.ID != want {
		return fmt.Errorf("domain file: %+v %v", d, err)
	}
	p := memfabric.New().Node("10.0.0.1").Process()
	e, err := NewEndpoint(context.Background(), Config{Process: p, Addr: "10.0.0.1:0", DomainDir: dir})
	if err != nil {
		return fmt.Errorf("endpoint: %w", err)
	}
	return e.Close()
}

// The same for a file of mode 0400 of a user without root's DAC override.
func TestOpenDomainFileReadOnlyToUsMode0400(t *testing.T) {
	if runChild(t, func(dir string) error {
		if err := endpointOn(dir, 0xff); err != nil {
			return fmt.Errorf("file of mode 0400: %w", err)
		}
		return nil
	}) {
		return
	}
	dir := childDomainDir(t)
	writeChildFile(t, dir, "goxrc-domain 1 00000000000000ff\n", 0o400)
	runAsNobody(t, dir)
}

// A file made under a umask that takes the owner's write bit (mode 0400)
// is written by its maker, which made it writable, and read by later
// opens. They opened it O_RDWR and were refused: NewEndpoint too, as it
// reads the file again after OpenXRCD, so such a user had no endpoint.
func TestOpenDomainFileMadeUnderUmask0277(t *testing.T) {
	if runChild(t, func(dir string) error {
		syscall.Umask(0o277)
		p := memfabric.New().Node("10.0.0.1").Process()
		e, err := NewEndpoint(context.Background(), Config{Process: p, Addr: "10.0.0.1:0", DomainDir: dir})
		if err != nil {
			return fmt.Errorf("endpoint, making the file under umask 0277: %v", err)
		}
		e.Close()
		if d, err := OpenDomainFile(context.Background(), dir); err != nil || d.ID == 0 {
			return fmt.Errorf("opened again: %+v %v", d, err)
		}
		return nil
	}) {
		return
	}
	runAsNobody(t, childDomainDir(t))
}

// A domain directory made under a umask that takes the owner's bits is
// made 0700 all the same: it came out 0500 (umask 0277) or 0600 (0177, as
// in a systemd unit's UMask=0177), the domain file could not be made in it
// (EACCES), and later processes were refused it too, whatever their umask.
func TestOpenDomainFileDirMadeUnderUmask(t *testing.T) {
	if runChild(t, func(dir string) error {
		for _, mask := range []int{0o277, 0o177} {
			sub := filepath.Join(dir, fmt.Sprintf("umask%#o", mask))
			old := syscall.Umask(mask)
			d, err := OpenDomainFile(context.Background(), sub)
			syscall.Umask(old)
			if err != nil || d.ID == 0 {
				return fmt.Errorf("umask %#o: %+v %v", mask, d, err)
			}
			if fi, err := os.Stat(sub); err != nil || fi.Mode().Perm() != 0o700 {
				return fmt.Errorf("umask %#o: directory %v %v, want mode 0700", mask, fi.Mode(), err)
			}
			if again, err := OpenDomainFile(context.Background(), sub); err != nil || again != d {
				return fmt.Errorf("umask %#o: opened again: %+v %v, want %+v", mask, again, err, d)
			}
		}
		return nil
	}) {
		return
	}
	runAsNobody(t, childDomainDir(t))
}

// A domain directory's missing parents made under such a umask are made
// 0700 too: MkdirAll made them 0500 or 0600, the domain directory could not
// be made in them (EACCES), and they stayed, refusing every later process.
func TestOpenDomainFileParentsMadeUnderUmask(t *testing.T) {
	if runChild(t, func(dir string) error {
		for _, mask := range []int{0o277, 0o177} {
			parent := filepath.Join(dir, fmt.Sprintf("umask%#o", mask), "run")
			sub := filepath.Join(parent, "goxrc")
			old := syscall.Umask(mask)
			d, err := OpenDomainFile(context.Background(), sub)
			syscall.Umask(old)
			if err != nil || d.ID == 0 {
				return fmt.Errorf("umask %#o: %+v %v", mask, d, err)
			}
			for _, p := range []string{filepath.Dir(parent), parent, sub} {
				if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o700 {
					return fmt.Errorf("umask %#o: %s: %v %v, want mode 0700", mask, p, fi.Mode(), err)
				}
			}
		}
		return nil
	}) {
		return
	}
	runAsNobody(t, childDomainDir(t))
}

// A domain file on a read-only mount serves too (a read-only bind mount,
// in a child's own mount namespace).
func TestOpenDomainFileReadOnlyMount(t *testing.T) {
	if runChild(t, func(dir string) error {
		if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
			return err
		}
		if err := unix.Mount("", dir, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "probe"), nil, 0o600); !errors.Is(err, unix.EROFS) {
			return fmt.Errorf("the mount is not read-only: %v", err)
		}
		if err := endpointOn(dir, 0xff); err != nil {
			return fmt.Errorf("file on a read-only mount: %w", err)
		}
		return nil
	}) {
		return
	}
	dir := filepath.Join(t.TempDir(), "goxrc")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, DomainFileName), []byte("goxrc-domain 1 00000000000000ff\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	runChildProc(t, exe, dir, &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS})
}

// An open of the domain file or directory that fails says what the errno
// means: every failure was "(it must be a regular file, not a symbolic
// link)" (or "a directory"), which sent one looking for a link that was not
// there when the errno was EPERM or EACCES.
func TestOpenDomainFileOpenErrorSaysWhy(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "goxrc")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, DomainFileName)
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	setImmutable(t, path) // empty: it needs the repair, which cannot write
	_, err := OpenDomainFile(context.Background(), dir)
	if err := wantOpenErr(err, unix.EPERM); err != nil {
		t.Error("empty immutable file:", err)
	}
	// A symbolic link is still called one.
	link := filepath.Join(t.TempDir(), "goxrc")
	if err := os.Mkdir(link, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(path, filepath.Join(link, DomainFileName)); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenDomainFile(context.Background(), link); !errors.Is(err, unix.ELOOP) || !strings.Contains(fmt.Sprint(err), "symbolic link") {
		t.Errorf("symbolic link: %v, want ELOOP that names the link", err)
	}
}

// The same for EACCES, met by a user without root's DAC override: a domain
// file or directory of its own of mode 0000.
func TestOpenDomainFileOpenErrorSaysWhyEACCES(t *testing.T) {
	if runChild(t, func(dir string) error {
		_, err := OpenDomainFile(context.Background(), dir)
		return wantOpenErr(err, unix.EACCES)
	}) {
		return
	}
	for _, c := range []struct {
		name              string
		dirMode, fileMode os.FileMode
	}{{"file", 0o700, 0}, {"directory", 0, 0o600}} {
		t.Run(c.name, func(t *testing.T) {
			dir := childDomainDir(t)
			writeChildFile(t, dir, "goxrc-domain 1 00000000000000ff\n", c.fileMode)
			if err := os.Chmod(dir, c.dirMode); err != nil {
				t.Fatal(err)
			}
			runAsNobody(t, dir)
		})
	}
}

// A domain directory or file of another user is refused saying whose it is
// and what to do, to a user without root's DAC override too: such a user was
// told "permission denied" (a directory or file of mode 0700 or 0600) or
// "want a directory of mode 0700" (one of mode 0755, which it cannot chmod),
// as when another user made /tmp/goxrc-<uid> first.
func TestOpenDomainFileForeignSaysWhose(t *testing.T) {
	if runChild(t, func(dir string) error {
		_, err := OpenDomainFile(context.Background(), dir)
		if !errors.Is(err, ErrDomainFile) {
			return fmt.Errorf("%v, want ErrDomainFile", err)
		}
		for _, want := range []string{"owned by uid 0", "DomainDir", "WithDomainPath", "remove"} {
			if !strings.Contains(fmt.Sprint(err), want) {
				return fmt.Errorf("%v: does not say %q", err, want)
			}
		}
		return nil
	}) {
		return
	}
	for _, c := range []struct {
		name    string
		dirMode os.FileMode
		rootDir bool // else the file is root's
	}{{"directory 0755", 0o755, true}, {"directory 0700", 0o700, true}, {"file", 0o700, false}} {
		t.Run(c.name, func(t *testing.T) {
			dir := childDomainDir(t)
			owned := filepath.Join(dir, DomainFileName)
			writeChildFile(t, dir, "goxrc-domain 1 00000000000000ff\n", 0o600)
			if c.rootDir {
				owned = dir
			}
			if err := os.Chown(owned, 0, 0); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(dir, c.dirMode); err != nil {
				t.Fatal(err)
			}
			runAsNobody(t, dir)
		})
	}
}

// A domain file just made is checked as an existing one is: where it does
// not come out as asked (a file system that forces its owner or mode), the
// process that made it used it, and every later one refused it. Here the
// file system is simulated by a thread whose file-system uid is another
// user's (its capabilities kept, so that it can reach the directory).
func TestOpenDomainFileChecksFreshFile(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("making a file of another user needs root")
	}
	dir := filepath.Join(t.TempDir(), "goxrc")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		// Never unlocked: the thread, its credentials changed, ends with
		// the goroutine.
		runtime.LockOSThread()
		const secbitNoSetuidFixup = 1 << 2
		if err := unix.Prctl(unix.PR_SET_SECUREBITS, secbitNoSetuidFixup, 0, 0, 0); err != nil {
			done <- fmt.Errorf("skip: PR_SET_SECUREBITS: %w", err)
			return
		}
		if err := unix.Setfsuid(nobody); err != nil {
			done <- fmt.Errorf("skip: setfsuid: %w", err)
			return
		}
		d, err := OpenDomainFile(context.Background(), dir)
		if err == nil {
			err = fmt.Errorf("made %+v", d)
		}
		done <- err
	}()
	err := <-done
	if s := fmt.Sprint(err); strings.HasPrefix(s, "skip: ") {
		t.Skip(s)
	}
	var st unix.Stat_t
	if serr := unix.Stat(filepath.Join(dir, DomainFileName), &st); serr != nil || st.Uid != nobody {
		t.Fatalf("the file was not made by uid 65534: %v, uid %d", serr, st.Uid)
	}
	if !errors.Is(err, ErrDomainFile) {
		t.Errorf("fresh file of uid 65534: %v, want ErrDomainFile", err)
	}
	if d, err := OpenDomainFile(context.Background(), dir); !errors.Is(err, ErrDomainFile) {
		t.Errorf("the same file, existing: %+v %v, want ErrDomainFile", d, err)
	}
}

// wantOpenErr checks an open's error: ErrDomainFile, the errno, and no talk
// of a symbolic link.
func wantOpenErr(err error, errno syscall.Errno) error {
	if !errors.Is(err, ErrDomainFile) || !errors.Is(err, errno) || strings.Contains(fmt.Sprint(err), "symbolic link") {
		return fmt.Errorf("%v, want ErrDomainFile and %v, with no symbolic link named", err, errno)
	}
	return nil
}

// setImmutable sets path's immutable flag (refusing a write even to root),
// cleared at the test's end.
func setImmutable(t *testing.T, path string) {
	t.Helper()
	if err := chattrImmutable(path, true); err != nil {
		t.Skipf("chattr +i %s: %v (needs CAP_LINUX_IMMUTABLE and a file system with the flag)", path, err)
	}
	t.Cleanup(func() { chattrImmutable(path, false) })
}

func chattrImmutable(path string, on bool) error {
	const immutable = 0x10 // FS_IMMUTABLE_FL
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	flags, err := unix.IoctlGetUint32(int(f.Fd()), unix.FS_IOC_GETFLAGS)
	if err != nil {
		return err
	}
	flags &^= immutable
	if on {
		flags |= immutable
	}
	return unix.IoctlSetPointerInt(int(f.Fd()), unix.FS_IOC_SETFLAGS, int(flags))
}

// childEnv names the domain directory to a child (runChildProc).
const childEnv = "GOXRC_DOMAINFILE_CHILD"

// runChild runs f on the directory named in childEnv and reports whether
// this is such a child (then the test is over).
func runChild(t *testing.T, f func(dir string) error) bool {
	dir := os.Getenv(childEnv)
	if dir == "" {
		if os.Geteuid() != 0 {
			t.Skip("the child (another user, or a mount namespace of its own) needs root")
		}
		return false
	}
	if err := f(dir); err != nil {
		t.Fatal(err)
	}
	return true
}

const nobody = 65534

// childDomainDir makes a domain directory (mode 0700) of nobody's, in a
// directory that nobody can reach, holding a copy of the test binary.
func childDomainDir(t *testing.T) string {
	base, err := os.MkdirTemp("", "goxrc-child")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		os.Chmod(filepath.Join(base, "goxrc"), 0o700)
		os.RemoveAll(base)
	})
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(exe)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(base, "xrc.test"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(base, "goxrc")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, nobody, nobody); err != nil {
		t.Fatal(err)
	}
	return dir
}

func writeChildFile(t *testing.T, dir, content string, mode os.FileMode) {
	path := filepath.Join(dir, DomainFileName)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, nobody, nobody); err != nil {
		t.Fatal(err)
	}
}

// runAsNobody runs this test in the copy of the binary beside dir as uid
// nobody, on dir.
func runAsNobody(t *testing.T, dir string) {
	t.Helper()
	runChildProc(t, filepath.Join(filepath.Dir(dir), "xrc.test"), dir,
		&syscall.SysProcAttr{Credential: &syscall.Credential{Uid: nobody, Gid: nobody}})
}

// runChildProc runs this test in exe, on dir, with attr.
func runChildProc(t *testing.T, exe, dir string, attr *syscall.SysProcAttr) {
	t.Helper()
	name := strings.Split(t.Name(), "/")[0]
	cmd := exec.Command(exe, "-test.run=^"+name+"$", "-test.count=1", "-test.v")
	cmd.Dir = filepath.Dir(dir)
	cmd.Env = append(os.Environ(), childEnv+"="+dir)
	cmd.SysProcAttr = attr
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
}

// A file system without flock (NFS, some FUSE ones) fails the directory's
// lock with ENOLCK or EOPNOTSUPP. That refusal is the domain file's, and it
// says what to do; a closed descriptor's EBADF stands in for it here.
func TestLockDirFailureIsTheDomainFiles(t *testing.T) {
	dir := t.TempDir()
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	err = lockDir(context.Background(), d, dir)
	if !errors.Is(err, ErrDomainFile) || !strings.Contains(err.Error(), dir) || !strings.Contains(err.Error(), "DomainDir") {
		t.Fatalf("lockDir on a descriptor flock refuses: %v, want ErrDomainFile naming %s and the way out", err, dir)
	}
}
