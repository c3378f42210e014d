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

// failingRecv is a fabric kernel whose receive poll fails with ENOMEM once
// fail is closed: the endpoint dies of an error whose errno reads as
// temporary.
type failingRecv struct {
	kernel.Kernel
	fail chan struct{}
}

func (f *failingRecv) PollRecv(ctx context.Context, h kernel.SRQ, out []kernel.RecvCompletion) (int, error) {
	select {
	case <-f.fail:
		return 0, syscall.ENOMEM
	default:
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-f.fail:
			cancel()
		case <-cctx.Done():
		}
	}()
	n, err := f.Kernel.PollRecv(cctx, h, out)
	if err != nil && ctx.Err() == nil {
		select {
		case <-f.fail:
			return 0, syscall.ENOMEM
		default:
		}
	}
	return n, err
}

// An XRC listener (WithFabric, or XRCRequire on a device with XRC) whose
// endpoint died of its kernel's failure is closed for good; its Accepts must
// say so in a way net.Listener users stop on, as an RC listener's do
// (TestBrokenListenerAcceptEndsServe). With a cause whose errno reads as
// temporary (ENOMEM), Accept's error had Temporary() true and did not match
// net.ErrClosed, so http.Server.Serve retried the dead listener for ever.
func TestFabricFailedListenerAcceptEndsServe(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	f := newFabric(t)
	l, fail := listenFailingRecv(ctx, t, f)
	defer l.Close()
	close(fail)
	var aerr error
	deadline := time.Now().Add(5 * time.Second)
	for {
		actx, acancel := context.WithTimeout(ctx, 100*time.Millisecond)
		_, aerr = l.Accept(actx)
		acancel()
		if aerr != nil && !errors.Is(aerr, context.DeadlineExceeded) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Accept did not fail after the endpoint died")
		}
	}
	requireAcceptEndsServe(t, l, aerr, "a listener whose endpoint died")
}

// listenFailingRecv listens on 10.1.0.1:7000 of f from a process whose
// receive poll fails (ENOMEM) once the returned channel is closed.
func listenFailingRecv(ctx context.Context, t *testing.T, f *memfabric.Fabric) (*Listener, chan struct{}) {
	t.Helper()
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
	return l, fk.fail
}
