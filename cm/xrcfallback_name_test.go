package cm

import (
	"strings"
	"testing"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/xrc"
)

// The fallback's logged reason names the CM's no-listener status: a REJ's
// reason 8 or a SIDR REP's status 1. It printed the bare number.
func TestPeerWithoutXRCNamesStatus(t *testing.T) {
	for _, c := range []struct {
		status int
		want   string
	}{
		{kernel.RejInvalidServiceID, "CM status 8: invalid service id (no listener)"},
		{kernel.SIDRNoListener, "CM status 1: service not supported (no listener)"},
	} {
		got := peerWithoutXRC(&xrc.RejectError{Reason: xrc.RejectNoListener, Status: c.status})
		if !strings.Contains(got, c.want) {
			t.Errorf("status %d: %q, want it to say %q", c.status, got, c.want)
		}
	}
}
