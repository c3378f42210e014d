package cm

import (
	"fmt"
	"testing"
)

// An Access prints its grants by name, as in a log line of what a region
// allows: it printed a bare number ("3").
func TestAccessNames(t *testing.T) {
	for _, c := range []struct {
		v    Access
		want string
	}{
		{RemoteRead, "RemoteRead"},
		{RemoteWrite, "RemoteWrite"},
		{RemoteRead | RemoteWrite, "RemoteRead|RemoteWrite"},
		{0, "0"},
		{RemoteWrite | 1<<4, "RemoteWrite|0x10"},
	} {
		if got := fmt.Sprintf("%v", c.v); got != c.want {
			t.Errorf("Access %d prints %q, want %q", uint8(c.v), got, c.want)
		}
	}
}
