package cm

import (
	"context"
	"errors"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// An XRC listener (WithFabric, or XRCRequire on a device with XRC) whose
// endpoint died of its kernel's failure is closed for good, its Accepts say
// (TestFabricFailedListenerAcceptEndsServe), but the endpoint's listening
// ids stayed in the kernel until the application's Close, with nothing
// reading them: a peer's Dial was queued for nobody and waited out its
// deadline (30 s here). It is now refused at once, as by a port nobody
// listens on.
func TestFabricFailedListenerRefusesDial(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	f := newFabric(t)
	k, _ := kernel.Unwrap(f.Node("10.1.0.1").Process())
	fk := &failingRecv{Kernel: k, fail: make(chan struct{})}
	fake := &memfabric.Process{}
	kernel.RegisterUnwrapper(func(v any) (kernel.Kernel, bool) {
		if v == any(fake) {
			return fk, true
		}
		return nil, false
	})
	l, err := Listen(ctx, "10.1.0.1:7000", WithFabric(fake), WithDomainPath(filepath.Join(t.TempDir(), "l")))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	close(fk.fail)
	deadline := time.Now().Add(5 * time.Second)
	for l.xep.Err() == nil {
		if time.Now().After(deadline) {
			t.Fatal("the listener's endpoint did not fail")
		}
		time.Sleep(time.Millisecond)
	}
	dctx, dcancel := context.WithTimeout(ctx, 30*time.Second)
	defer dcancel()
	start := time.Now()
	c, err := Dial(dctx, l.Addr().String(), WithFabric(f.Node("10.1.0.2").Process()), WithDomainPath(filepath.Join(t.TempDir(), "d")))
	took := time.Since(start)
	if err == nil {
		c.Close()
	}
	if !errors.Is(err, syscall.ECONNREFUSED) || took > 3*time.Second {
		t.Fatalf("Dial to a listener whose endpoint failed: %v after %v; want ECONNREFUSED at once", err, took.Round(time.Millisecond))
	}
	t.Logf("Dial: %v after %v", err, took.Round(time.Millisecond))
}
