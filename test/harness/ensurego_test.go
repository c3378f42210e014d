package harness

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// ensureGoReadOnly runs in a mount namespace of its own: it hides the Go
// installs test/lib.sh's ensure_go looks at first, puts a toolchain where
// ensure_go installs the one it fetches (a go that tells its version only),
// makes /usr/local/lib read-only and calls ensure_go, with $1 first in PATH.
const ensureGoReadOnly = `set -e
for d in /usr/local/go /usr/lib/go; do [[ ! -d $d ]] || mount -t tmpfs tmpfs $d; done
mount -t tmpfs tmpfs /usr/local/lib
source ../lib.sh
case $(uname -m) in x86_64) arch=amd64;; aarch64) arch=arm64;; esac
bin=/usr/local/lib/goxrc-go/golang.org/toolchain@v0.0.1-$GO_TOOLCHAIN.linux-$arch/bin
mkdir -p "$bin" && printf '#!/bin/sh\necho %s\n' "$GO_TOOLCHAIN" > "$bin/go" && chmod +x "$bin/go"
mount -o remount,ro,bind /usr/local/lib
PATH=$1:/usr/sbin:/usr/bin:/sbin:/bin bash -c 'set -euo pipefail; source ../lib.sh; ensure_go >&2; command -v go'`

// TestEnsureGoReadOnlyInstalled: test/lib.sh's ensure_go, where the
// toolchain it fetches is installed already, only reads it: it must serve a
// read-only /usr/local/lib (an image baked with it) as it did before its
// install took a lock file there.
func TestEnsureGoReadOnlyInstalled(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: a mount namespace")
	}
	if err := exec.Command("unshare", "-m", "--propagation", "private", "true").Run(); err != nil {
		t.Skipf("no mount namespace here: %v", err)
	}
	if _, err := os.Stat("/usr/local/lib"); err != nil {
		t.Skipf("no /usr/local/lib to mount over: %v", err)
	}
	// Debian's golang-go has no candidate: ensure_go goes on to its own toolchain.
	bin := fakeCommands(t, t.TempDir(), map[string]string{"apt-cache": "exit 0"})
	out, err := exec.Command("unshare", "-m", "--propagation", "private", "bash", "-c", ensureGoReadOnly, "bash", bin).CombinedOutput()
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if err != nil || !strings.HasPrefix(lines[len(lines)-1], "/usr/local/lib/goxrc-go/golang.org/toolchain@") ||
		filepath.Base(lines[len(lines)-1]) != "go" {
		t.Errorf("ensure_go with its toolchain installed on a read-only /usr/local/lib: %v, want that go first in PATH:\n%s", err, out)
	}
}
