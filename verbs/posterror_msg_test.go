package verbs_test

import (
	"errors"
	"syscall"
	"testing"

	"github.com/goxrc/goxrc/verbs"
)

// A post the driver failed without naming a work request (Index and Posted
// -1, as PostError's doc says) read "work request -1: cannot allocate
// memory": the "unknown" marker printed as if it were a request's index.
// One the driver named keeps its index.
func TestPostErrorWithoutIndexSaysSo(t *testing.T) {
	err := error(&verbs.OpError{Op: "ibv_post_send", Addr: "rxe0 QP 0x11",
		Err: &verbs.PostError{Index: -1, Posted: -1, Err: syscall.ENOMEM}})
	if want := "ibv_post_send rxe0 QP 0x11: work request unknown (the driver named none): cannot allocate memory"; err.Error() != want {
		t.Errorf("%q, want %q", err, want)
	}
	if !errors.Is(err, syscall.ENOMEM) {
		t.Errorf("%v does not match ENOMEM", err)
	}
	named := &verbs.PostError{Index: 2, Posted: 2, Err: syscall.EINVAL}
	if want := "work request 2: invalid argument"; named.Error() != want {
		t.Errorf("%q, want %q", named, want)
	}
}
