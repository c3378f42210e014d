//go:build unix

package cm

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// A same-user process that holds the domain directory's lock (stopped with
// it held, say) must not hold Listen or Dial past their contexts.
func TestFabricDomainLockHonoursContext(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "xrc")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	holder, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if err := unix.Flock(int(holder.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	n := newFabric(t).Node("10.7.0.1")
	p := n.Process()
	defer p.Kill()
	for _, op := range []string{"listen", "dial"} {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		done := make(chan error, 1)
		go func() {
			var c interface{ Close() error }
			var err error
			if op == "listen" {
				c, err = Listen(ctx, "10.7.0.1:0", WithFabric(p), WithDomainPath(dir))
			} else {
				c, err = Dial(ctx, "10.7.0.1:7000", WithFabric(p), WithDomainPath(dir))
			}
			if err == nil {
				c.Close()
			}
			done <- err
		}()
		select {
		case err := <-done:
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("%s: %v, want an error matching context.DeadlineExceeded", op, err)
			}
		case <-time.After(5 * time.Second):
			unix.Flock(int(holder.Fd()), unix.LOCK_UN) // let it finish
			<-done
			cancel()
			t.Fatalf("%s still waits for the domain directory's lock 5 s after its context ended", op)
		}
		cancel()
	}
	if h := p.Handles(); h != 0 {
		t.Errorf("%d kernel handles left", h)
	}
}
