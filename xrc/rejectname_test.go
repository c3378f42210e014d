package xrc

import (
	"net/netip"
	"testing"

	"github.com/goxrc/goxrc/internal/kernel"
)

// A CM refusal names its status as the CM numbers it for the exchange: an
// IB CM reject reason for a REJ, a SIDR status for a SIDR REP. It printed
// the bare number ("CM status 10"), which means one thing as a REJ reason
// and another as a SIDR status (2 is "no EEC" or "rejected").
func TestRejectErrorNamesCMStatus(t *testing.T) {
	addr := netip.MustParseAddrPort("10.1.0.1:7471")
	for _, c := range []struct {
		ev   kernel.Event
		want string
	}{
		{kernel.Event{Type: kernel.EventRejected, Status: kernel.RejStaleConn},
			"connection refused: CM_REJECT (detail 0, CM status 10: stale connection)"},
		{kernel.Event{Type: kernel.EventRejected, Status: kernel.RejInvalidServiceID},
			"connection refused: NO_LISTENER (detail 0, CM status 8: invalid service id (no listener))"},
		{kernel.Event{Type: kernel.EventUnreachable, Status: kernel.SIDRRejected},
			"connection refused: CM_REJECT (detail 0, CM status 2: rejected)"},
		{kernel.Event{Type: kernel.EventUnreachable, Status: kernel.SIDRNoListener},
			"connection refused: NO_LISTENER (detail 0, CM status 1: service not supported (no listener))"},
	} {
		if got := rejectErr(addr, c.ev).Error(); got != c.want {
			t.Errorf("%v status %d: %q, want %q", c.ev.Type, c.ev.Status, got, c.want)
		}
	}
}

// Which code space a positive Status is in is the exported SIDR field, so
// that an application reading Status can tell, and a RejectError built
// outside the package (a test's fake peer, say) is named as the library's
// are. The field was unexported: such an error named a SIDR status as a
// reject reason.
func TestRejectErrorSIDRField(t *testing.T) {
	addr := netip.MustParseAddrPort("10.1.0.1:7471")
	if e := rejectErr(addr, kernel.Event{Type: kernel.EventUnreachable, Status: kernel.SIDRRejected}); !e.(*RejectError).SIDR {
		t.Errorf("a SIDR reply's refusal: SIDR false")
	}
	if e := rejectErr(addr, kernel.Event{Type: kernel.EventRejected, Status: kernel.RejStaleConn}); e.(*RejectError).SIDR {
		t.Errorf("a REJ: SIDR true")
	}
	built := &RejectError{Reason: RejectCM, Status: int(kernel.SIDRRejected), SIDR: true}
	if got, want := built.Error(), "connection refused: CM_REJECT (detail 0, CM status 2: rejected)"; got != want {
		t.Errorf("%q, want %q", got, want)
	}
}
