//go:build unix

package xrc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/goxrc/goxrc/xrc/memfabric"
)

func TestOpenDomainFileCreatesOnceAndReuses(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "goxrc")
	d1, err := OpenDomainFile(context.Background(), dir)
	if err != nil {
		t.Fatal(err)
	}
	if d1.ID == 0 || d1.Path != filepath.Join(dir, DomainFileName) {
		t.Fatalf("%+v", d1)
	}
	for _, c := range []struct {
		path string
		perm os.FileMode
	}{{dir, 0o700}, {d1.Path, 0o600}} {
		fi, err := os.Stat(c.path)
		if err != nil || fi.Mode().Perm() != c.perm {
			t.Fatalf("%s: %v %v, want %v", c.path, fi.Mode(), err, c.perm)
		}
	}
	d2, err := OpenDomainFile(context.Background(), dir)
	if err != nil || d2 != d1 {
		t.Fatalf("second open: %+v %v, want %+v", d2, err, d1)
	}
}

func TestOpenDomainFileConcurrentAgree(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "goxrc")
	const n = 16
	ids := make([]DomainFile, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { ids[i], errs[i] = OpenDomainFile(context.Background(), dir) })
	}
	wg.Wait()
	for i := range n {
		if errs[i] != nil || ids[i] != ids[0] {
			t.Fatalf("%d: %+v %v, want %+v", i, ids[i], errs[i], ids[0])
		}
	}
}

func TestOpenDomainFileRecreatedIsNewDomain(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "goxrc")
	d1, _ := OpenDomainFile(context.Background(), dir)
	os.Remove(d1.Path)
	d2, err := OpenDomainFile(context.Background(), dir)
	if err != nil || d2.ID == d1.ID {
		t.Fatalf("recreated: %+v %v", d2, err)
	}
}

func TestOpenDomainFileRefusesUnsafe(t *testing.T) {
	dir := t.TempDir() // mode 0755 here
	os.Chmod(dir, 0o755)
	if _, err := OpenDomainFile(context.Background(), dir); !errors.Is(err, ErrDomainFile) {
		t.Fatalf("open dir: %v", err)
	}
	os.Chmod(dir, 0o700)
	path := filepath.Join(dir, DomainFileName)
	os.WriteFile(path, []byte("goxrc-domain 1 00000000000000ff\n"), 0o644)
	os.Chmod(path, 0o644)
	if _, err := OpenDomainFile(context.Background(), dir); !errors.Is(err, ErrDomainFile) {
		t.Fatalf("world-readable file: %v", err)
	}
	os.Chmod(path, 0o600)
	if d, err := OpenDomainFile(context.Background(), dir); err != nil || d.ID != 0xff {
		t.Fatalf("hand-written file: %+v %v", d, err)
	}
	os.WriteFile(path, []byte("garbage"), 0o600)
	if _, err := OpenDomainFile(context.Background(), dir); !errors.Is(err, ErrDomainFile) {
		t.Fatalf("garbage: %v", err)
	}
	os.WriteFile(path, []byte("goxrc-domain 1 0000000000000000\n"), 0o600)
	if _, err := OpenDomainFile(context.Background(), dir); !errors.Is(err, ErrDomainFile) {
		t.Fatalf("zero id: %v", err)
	}
	os.WriteFile(path, nil, 0o600) // a creator that died before writing
	if d, err := OpenDomainFile(context.Background(), dir); err != nil || d.ID == 0 {
		t.Fatalf("empty file: %+v %v", d, err)
	}
}

// A domain directory or file of another user, or a symbolic link in either
// place, is refused: the default directory has a predictable name in /tmp,
// and the file's permissions are the domain's only access control. (Both
// were followed and used; through a symlink to an empty 0600 file, the
// domain line was written into it.)
func TestOpenDomainFileRefusesForeignOrLinked(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "goxrc")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	victim := filepath.Join(base, "victim")
	if err := os.WriteFile(victim, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(dir, DomainFileName)); err != nil {
		t.Fatal(err)
	}
	if d, err := OpenDomainFile(context.Background(), dir); !errors.Is(err, ErrDomainFile) {
		t.Errorf("symlinked file: %+v %v", d, err)
	}
	if b, _ := os.ReadFile(victim); len(b) != 0 {
		t.Errorf("written through the link: %q", b)
	}
	linked := filepath.Join(base, "linked")
	if err := os.Symlink(dir, linked); err != nil {
		t.Fatal(err)
	}
	if d, err := OpenDomainFile(context.Background(), linked); !errors.Is(err, ErrDomainFile) {
		t.Errorf("symlinked directory: %+v %v", d, err)
	}
	t.Run("owned by another user", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("making a file of another user needs chown, which needs root (CI runs as root)")
		}
		testDomainFileForeignOwner(t, base)
	})
}

func testDomainFileForeignOwner(t *testing.T, base string) {
	other := filepath.Join(base, "other")
	if err := os.Mkdir(other, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(other, DomainFileName)
	if err := os.WriteFile(path, []byte("goxrc-domain 1 00000000deadbeef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if d, err := OpenDomainFile(context.Background(), other); !errors.Is(err, ErrDomainFile) {
		t.Errorf("file of uid 65534: %+v %v", d, err)
	}
	if err := os.Chown(path, 0, 0); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(other, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	d, err := OpenDomainFile(context.Background(), other)
	if !errors.Is(err, ErrDomainFile) {
		t.Errorf("directory of uid 65534: %+v %v", d, err)
	}
	// The message says what to do: name another directory, or remove this.
	for _, remedy := range []string{"DomainDir", "WithDomainPath", "remove"} {
		if !strings.Contains(fmt.Sprint(err), remedy) {
			t.Errorf("directory of uid 65534: %v: no remedy %q named", err, remedy)
		}
	}
}

// A domain directory that is a symbolic link is refused however the path is
// written: with a trailing "/" or "/." the kernel follows the link in spite
// of O_NOFOLLOW, and the link's target became the domain directory. The
// refusal names the link: O_NOFOLLOW with O_DIRECTORY fails ENOTDIR, not
// ELOOP, and it said only "not a directory" of what lists as a directory.
func TestOpenDomainFileRefusesLinkedDirWithTrailingSlash(t *testing.T) {
	base := t.TempDir()
	target := filepath.Join(base, "target")
	if err := os.Mkdir(target, 0o700); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(base, "goxrc")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{link, link + "/", link + "//", link + "/."} {
		d, err := OpenDomainFile(context.Background(), dir)
		if !errors.Is(err, ErrDomainFile) {
			t.Errorf("%q: %+v %v, want ErrDomainFile", dir, d, err)
		}
		if dir == link && !strings.Contains(fmt.Sprint(err), "symbolic link") {
			t.Errorf("%q: %v, want it to name the symbolic link", dir, err)
		}
	}
	if _, err := os.Stat(filepath.Join(target, DomainFileName)); !os.IsNotExist(err) {
		t.Errorf("a domain file was made in the link's target: %v", err)
	}
	// A plain directory written so still works.
	dir := filepath.Join(base, "plain")
	d1, err := OpenDomainFile(context.Background(), dir+"/")
	if err != nil {
		t.Fatal(err)
	}
	if d2, err := OpenDomainFile(context.Background(), dir); err != nil || d2 != d1 {
		t.Fatalf("%+v %v, want %+v", d2, err, d1)
	}
}

// What stands in the domain directory's place, a dangling symbolic link or
// a file, is refused as ErrDomainFile says, as a link to a directory is: it
// was a bare "mkdir: file exists" (or "not a directory") that matched no
// sentinel and did not say what was wrong.
func TestOpenDomainFileDanglingLinkOrFileInPlace(t *testing.T) {
	base := t.TempDir()
	dangling := filepath.Join(base, "dangling")
	if err := os.Symlink(filepath.Join(base, "nowhere"), dangling); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(base, "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{dangling, file} {
		if d, err := OpenDomainFile(context.Background(), dir); !errors.Is(err, ErrDomainFile) {
			t.Errorf("%s: %+v %v, want ErrDomainFile", dir, d, err)
		}
	}
	if _, err := os.Lstat(filepath.Join(base, "nowhere")); !os.IsNotExist(err) {
		t.Errorf("the link's target was made: %v", err)
	}
}

// A process of the same user that holds the domain directory's lock (one
// stopped with it held, say) must not hold NewEndpoint past its context.
func TestNewEndpointDomainLockHonoursContext(t *testing.T) {
	dir, holder := lockedDomainDir(t)
	p := memfabric.New().Node("10.0.0.1").Process()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	type result struct {
		e   *Endpoint
		err error
	}
	done := make(chan result, 1)
	go func() {
		e, err := NewEndpoint(ctx, Config{Process: p, Addr: "10.0.0.1:0", DomainDir: dir})
		done <- result{e, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(5 * time.Second):
		// Let the stuck call finish so that it leaks nothing.
		unix.Flock(int(holder.Fd()), unix.LOCK_UN)
		if r := <-done; r.e != nil {
			r.e.Close()
		}
		t.Fatal("NewEndpoint still waits for the domain directory's lock 5 s after its context ended")
	}
	if r.e != nil {
		r.e.Close()
		t.Fatal("NewEndpoint succeeded while another process held the domain lock")
	}
	if !errors.Is(r.err, context.DeadlineExceeded) {
		t.Fatalf("NewEndpoint: %v, want an error matching context.DeadlineExceeded", r.err)
	}
	if n := p.Handles(); n != 0 {
		t.Errorf("%d kernel handles left", n)
	}
	// Once the lock is free, an endpoint opens.
	unix.Flock(int(holder.Fd()), unix.LOCK_UN)
	e, err := NewEndpoint(context.Background(), Config{Process: p, Addr: "10.0.0.1:0", DomainDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	e.Close()
}

// lockedDomainDir makes a domain directory and takes its lock, as another
// process of the same user holding it would; holder's Fd unlocks it.
func lockedDomainDir(t *testing.T) (string, *os.File) {
	t.Helper()
	dir := t.TempDir() + "/goxrc"
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	holder, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Close() })
	if err := unix.Flock(int(holder.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	return dir, holder
}

// OpenDomainFile waits for a held lock only until its context ends (it
// waited for ever before it took one).
func TestOpenDomainFileLockHonoursContext(t *testing.T) {
	dir, holder := lockedDomainDir(t)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := OpenDomainFile(ctx, dir)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("OpenDomainFile: %v, want an error matching context.DeadlineExceeded", err)
		}
	case <-time.After(5 * time.Second):
		unix.Flock(int(holder.Fd()), unix.LOCK_UN)
		<-done
		t.Fatal("OpenDomainFile still waits for the domain directory's lock 5 s after its context ended")
	}
	unix.Flock(int(holder.Fd()), unix.LOCK_UN)
	if d, err := OpenDomainFile(context.Background(), dir); err != nil || d.ID == 0 {
		t.Fatalf("OpenDomainFile with the lock free: %+v, %v", d, err)
	}
}

// An empty directory name is an error, as it was before the name was
// cleaned: filepath.Clean makes "" the working directory ("."), and a
// private working directory (a home directory of mode 0700, say) became
// the domain directory, the domain file made in it.
func TestOpenDomainFileRefusesEmptyDir(t *testing.T) {
	wd := filepath.Join(t.TempDir(), "wd")
	if err := os.Mkdir(wd, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Chdir(wd)
	if d, err := OpenDomainFile(context.Background(), ""); err == nil {
		t.Errorf("OpenDomainFile(ctx, \"\"): %+v, want an error", d)
	}
	if _, err := os.Lstat(filepath.Join(wd, DomainFileName)); !os.IsNotExist(err) {
		t.Errorf("a domain file was made in the working directory: %v", err)
	}
}
