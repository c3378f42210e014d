//go:build linux && cgo

package integration

import (
	"testing"

	"github.com/goxrc/goxrc/rdmacm"
)

// rdmacmCheckContext checks the verbs context of a bound id.
func rdmacmCheckContext(t *testing.T, id *rdmacm.ID, dev string) {
	t.Helper()
	c := id.Context()
	if c == nil {
		t.Errorf("Context() of an id bound to %s is nil", dev)
		return
	}
	if c.Name() != dev {
		t.Errorf("Context().Name() = %q, want %q", c.Name(), dev)
	}
	if err := c.Close(); err != nil {
		t.Errorf("closing the wrapper: %v", err)
	}
}
