package xrc

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// AcceptIn says why once its term has ended: ErrClosed, or the endpoint's
// error if it failed. The zero AcceptTerm has ended, and on an endpoint
// whose device failed AcceptIn with it said ErrClosed (which cm takes for
// the application's Close), while Accept, and AcceptIn with any term the
// endpoint gave, said ErrDeviceRemoved.
func TestAcceptInZeroTermSaysEndpointsFailure(t *testing.T) {
	w := newWorld(t)
	a := w.endpoint("10.0.101.1", 7000)
	stopped := a.Term()
	a.StopAccepting()
	cur := a.ResumeAccepting()
	w.f.Node("10.0.101.1").FailDevice()
	eventually(t, "the endpoint failed", func() (bool, string) {
		err := a.Err()
		return err != nil, fmt.Sprint(err)
	})
	ctx := ctxT(t, 5*time.Second)
	for name, term := range map[string]AcceptTerm{"zero": {}, "ended": stopped, "current": cur} {
		if _, err := a.AcceptIn(ctx, term); !errors.Is(err, ErrDeviceRemoved) {
			t.Errorf("AcceptIn(%s term) on an endpoint whose device failed: %v, want ErrDeviceRemoved", name, err)
		}
	}
}
