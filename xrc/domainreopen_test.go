//go:build linux

package xrc

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/goxrc/goxrc/internal/kernel"
)

// swapOnOpenXRCD runs swap before the engine's first OpenXRCD reaches the
// kernel and back after it: what another user who can write a parent of the
// domain directory can do between the engine's checks and the kernel's open.
type swapOnOpenXRCD struct {
	kernel.Kernel
	once       sync.Once
	swap, back func()
}

func (k *swapOnOpenXRCD) OpenXRCD(path string, flags kernel.XRCDFlags) (kernel.XRCD, error) {
	first := false
	k.once.Do(func() { first = true })
	if first {
		k.swap()
		defer k.back()
	}
	return k.Kernel.OpenXRCD(path, flags)
}

// The kernel opens the domain file the engine checked (a regular file of
// its own, mode 0600, in its own private directory), not whatever the path
// names again when the kernel opens it. It opened the path again: another
// user who can write a parent of the domain directory (one the directory
// was made in, a DomainDir under a shared directory) swapped in a directory
// of its own for that moment and back, and the endpoint's XRC domain was
// keyed to the other user's file, which it can open to join the domain and
// open any TGT in it (facts.md: file permissions are the only access
// control). The second read of the id did not see it: the path named the
// checked file again by then.
func TestNewEndpointKernelOpensTheCheckedDomainFile(t *testing.T) {
	w := newWorld(t)
	base := t.TempDir()
	parent := filepath.Join(base, "shared") // writable by the other user
	dir := filepath.Join(parent, "goxrc")
	evil := filepath.Join(base, "evil") // the other user's
	for _, d := range []string{parent, evil} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	evilFile := filepath.Join(evil, DomainFileName)
	if err := os.WriteFile(evilFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	p := w.f.Node("10.0.9.1").Process()
	k, _ := kernel.Unwrap(p)
	sk := &swapOnOpenXRCD{Kernel: k,
		swap: func() {
			if err := os.Rename(dir, dir+".mine"); err != nil {
				t.Error(err)
			}
			if err := os.Symlink(evil, dir); err != nil {
				t.Error(err)
			}
		},
		back: func() {
			if err := os.Remove(dir); err != nil {
				t.Error(err)
			}
			if err := os.Rename(dir+".mine", dir); err != nil {
				t.Error(err)
			}
		}}
	cfg := Config{Process: p, Addr: "10.0.9.1:0", DomainDir: dir,
		Heartbeat: testHeartbeat, IdleTimeout: testIdle, HandshakeTimeout: testHandshake}
	e, err := newEndpoint(context.Background(), sk, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	// Another process of the node: the other user's, and one that opens
	// the domain the engine checked.
	other, _ := kernel.Unwrap(w.f.Node("10.0.9.1").Process())
	if x, err := other.OpenXRCD(evilFile, 0); err == nil {
		other.CloseXRCD(x)
		t.Errorf("the endpoint's XRC domain is keyed to the other user's file %s, swapped in while the kernel opened the path", evilFile)
	}
	if x, err := other.OpenXRCD(filepath.Join(dir, DomainFileName), 0); err != nil {
		t.Errorf("no XRC domain on the checked domain file: %v", err)
	} else {
		other.CloseXRCD(x)
	}
}
