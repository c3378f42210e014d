package harness

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// needRootAnd skips t unless it runs as root, on a machine with every one of
// tools: the scripts under test (what, the skip message's subject) refuse to
// run otherwise, and nothing else lacks them where CI runs.
func needRootAnd(t *testing.T, what string, tools ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip(what + " runs as root only")
	}
	for _, name := range tools {
		if _, err := exec.LookPath(name); err != nil {
			t.Skipf("no %s on this machine", name)
		}
	}
}

// fakeCommands writes each of fakes (name: bash body) as an executable
// script in a new directory bin under dir, to go first in PATH, and
// returns bin.
func fakeCommands(t *testing.T, dir string, fakes map[string]string) string {
	t.Helper()
	bin := filepath.Join(dir, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range fakes {
		if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/bash\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return bin
}

// writeFiles writes each of files (path: contents), making their
// directories.
func writeFiles(t *testing.T, files map[string]string) {
	t.Helper()
	for p, body := range files {
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// pinnedKernel is the Debian kernel test/vm/rxe-vm.sh boots by default.
const pinnedKernel = "6.1.0-47-amd64"

// fakeKernel adds to files what test/vm/rxe-vm.sh looks for of the pinned
// kernel under the work dir work, as if it had fetched it before.
func fakeKernel(files map[string]string, work string) {
	root := filepath.Join(work, "kernel", pinnedKernel, "root")
	files[filepath.Join(root, "boot/vmlinuz-"+pinnedKernel)] = "kernel"
	files[filepath.Join(root, "lib/modules/"+pinnedKernel+"/modules.dep.bin")] = "deps"
}
