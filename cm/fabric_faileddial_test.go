package cm

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/conntest"
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
	l, fail := listenFailingRecv(ctx, t, f)
	defer l.Close()
	close(fail)
	conntest.Eventually(t, 5*time.Second, "the listener's endpoint fails", func() (bool, string) {
		return l.xep.Err() != nil, "no error"
	})
	dctx, dcancel := context.WithTimeout(ctx, 30*time.Second)
	defer dcancel()
	took, err := timedDial(dctx, t, f, l.Addr().String())
	if !errors.Is(err, syscall.ECONNREFUSED) || took > 3*time.Second {
		t.Fatalf("Dial to a listener whose endpoint failed: %v after %v; want ECONNREFUSED at once", err, took.Round(time.Millisecond))
	}
	t.Logf("Dial: %v after %v", err, took.Round(time.Millisecond))
}
