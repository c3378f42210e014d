package harness

import (
	"errors"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// staleListFakes act as a package manager whose lists are older than the
// mirror: they still name the pinned kernel, which the mirror has dropped,
// so apt-get download fails until apt-get update has run ($STATE/updated).
// dpkg-deb and depmod make what test/vm/rxe-vm.sh looks for of a kernel.
var staleListFakes = map[string]string{
	"dpkg-query": vmFakes["dpkg-query"],
	"modprobe":   vmFakes["modprobe"],
	"apt-cache":  `exit 0`,
	"apt-get": `while [[ $1 == -o ]]; do shift 2; done
case $1 in
update) : > "$STATE/updated";;
download) [[ -e $STATE/updated ]] || { echo "E: Failed to fetch .../$2.deb  404  Not Found" >&2; exit 100; }
  : > "$2.deb";;
esac`,
	"dpkg-deb": `mkdir -p "$3/boot" && : > "$3/boot/vmlinuz-` + pinnedKernel + `"`,
	"depmod":   `mkdir -p "$2/lib/modules/$3" && : > "$2/lib/modules/$3/modules.dep.bin"`,
}

// TestVMPrepareRefreshesStaleLists: test/vm/rxe-vm.sh --prepare fetches the
// guest's kernel when it is not cached (a first run, a wiped cache). Package
// lists older than the mirror still name the pinned kernel after the mirror
// has dropped it; the download must not fail on them, on this run and every
// run after it, where apt-get update would have found it gone (and the
// kernel that replaced it).
func TestVMPrepareRefreshesStaleLists(t *testing.T) {
	work, out, err := prepareWith(t, staleListFakes)
	if err != nil {
		t.Fatalf("rxe-vm.sh --prepare with lists older than the mirror: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "prepared: ") {
		t.Errorf("rxe-vm.sh --prepare did not say what it prepared:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(work, "kernel", pinnedKernel, "root", "boot", "vmlinuz-"+pinnedKernel)); err != nil {
		t.Errorf("no kernel in the cache: %v\n%s", err, out)
	}
}

// TestVMPrepareSaysNoKernel: where the mirror has neither the pinned kernel
// nor linux-image-amd64, test/vm/rxe-vm.sh --prepare ends as a VM that
// cannot run (125) and says so. apt-cache's failure in the lookup of the
// fallback ended it under set -e, with apt's status (100) and its words.
func TestVMPrepareSaysNoKernel(t *testing.T) {
	fakes := maps.Clone(staleListFakes)
	fakes["apt-cache"] = `echo "E: No packages found" >&2; exit 100`
	_, out, err := prepareWith(t, fakes)
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 125 || !strings.Contains(string(out), "nor linux-image-amd64 is available") {
		t.Errorf("rxe-vm.sh --prepare with no kernel on the mirror: %v, want exit status 125 saying so:\n%s", err, out)
	}
}

// prepareWith runs test/vm/rxe-vm.sh --prepare with fakes, in a work dir
// of its own, and returns that dir and its output and error.
func prepareWith(t *testing.T, fakes map[string]string) (work string, out []byte, err error) {
	t.Helper()
	needRootAnd(t, "test/vm/rxe-vm.sh", "bash", "flock", "cpio", "gzip", "/bin/busybox")
	dir := t.TempDir()
	bin, work, state := fakeCommands(t, dir, fakes), filepath.Join(dir, "work"), filepath.Join(dir, "state")
	if err := os.Mkdir(state, 0o755); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", "../vm/rxe-vm.sh", "--no-rxe", "--prepare")
	cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"), "GOXRC_VM_WORK="+work, "STATE="+state)
	out, err = cmd.CombinedOutput()
	return work, out, err
}
