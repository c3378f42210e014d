package rdmacm

import (
	"strings"
	"testing"

	"github.com/goxrc/goxrc/verbs"
)

// A REJECTED or UNREACHABLE event prints its reject reason or SIDR status
// by name, as RejectError does: Event.String and UnexpectedEventError
// printed the bare number ("REJECTED status=10").
func TestEventStatusPrintsItsName(t *testing.T) {
	udp := &ID{qpType: verbs.QPTypeUD}
	for _, c := range []struct {
		ev   Event
		want string
	}{
		{Event{Type: EventRejected, Status: RejectStaleConn}, "REJECTED status=10 (stale connection)"},
		{Event{Type: EventRejected, Status: RejectConsumerDefined}, "REJECTED status=28 (consumer defined)"},
		{Event{Type: EventUnreachable, Status: SIDRReject, ID: udp}, "UNREACHABLE status=2 (rejected)"},
		{Event{Type: EventUnreachable, Status: SIDRUnsupported, ID: udp}, "UNREACHABLE status=1 (service not supported (no listener))"},
		{Event{Type: EventEstablished}, "ESTABLISHED status=0"},
	} {
		if got := c.ev.String(); got != c.want {
			t.Errorf("Event.String() = %q, want %q", got, c.want)
		}
	}
	err := &UnexpectedEventError{Want: EventEstablished, Event: Event{Type: EventRejected, Status: RejectInvalidServiceID}}
	if got := err.Error(); !strings.Contains(got, "invalid service id") {
		t.Errorf("UnexpectedEventError = %q, want the reject reason named", got)
	}
}
