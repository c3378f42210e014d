package xrc

import (
	"errors"
	"strings"
	"syscall"
	"testing"
)

// RejectError as its documentation says: a refusal (any non-negative
// Status) matches ECONNREFUSED and is no Timeout; an unanswered request
// (negative Status, an errno) matches that errno, not ECONNREFUSED, and is
// a Timeout (and Temporary) only for ETIMEDOUT; Error leaves the address
// out. RejectReason names every reason, the protocol's and the CM's.
func TestDocRejectError(t *testing.T) {
	for _, r := range []RejectReason{RejectVersion, RejectNoXRC, RejectTGTGone, RejectDomainMismatch,
		RejectBusyRetry, RejectApp, RejectBadRequest, RejectNoListener, RejectCM} {
		e := &RejectError{Addr: "10.0.0.9:7000", Reason: r, Status: 28}
		if !errors.Is(e, syscall.ECONNREFUSED) || e.Timeout() || e.Temporary() {
			t.Errorf("refused %v: ECONNREFUSED %v, Timeout %v, Temporary %v; want true, false, false",
				r, errors.Is(e, syscall.ECONNREFUSED), e.Timeout(), e.Temporary())
		}
		if strings.Contains(e.Error(), e.Addr) {
			t.Errorf("%q names the address", e.Error())
		}
		if s := r.String(); s == "" || strings.HasPrefix(s, "RejectReason(") {
			t.Errorf("reason %d has no name: %q", uint8(r), s)
		}
	}
	want := map[RejectReason]string{RejectVersion: "VERSION", RejectNoXRC: "NO_XRC", RejectTGTGone: "TGT_GONE",
		RejectDomainMismatch: "DOMAIN_MISMATCH", RejectBusyRetry: "BUSY_RETRY", RejectApp: "APP_REJECT",
		RejectBadRequest: "BAD_REQUEST", RejectNoListener: "NO_LISTENER", RejectCM: "CM_REJECT"}
	for r, s := range want {
		if r.String() != s {
			t.Errorf("reason %d is %q, want %q", uint8(r), r, s)
		}
	}
	for _, c := range []struct {
		errno   syscall.Errno
		timeout bool
	}{{syscall.ETIMEDOUT, true}, {syscall.EHOSTUNREACH, false}, {syscall.ENETUNREACH, false}} {
		e := &RejectError{Status: -int(c.errno)}
		if !errors.Is(e, c.errno) || errors.Is(e, syscall.ECONNREFUSED) || e.Timeout() != c.timeout || e.Temporary() != c.timeout {
			t.Errorf("unanswered (%v): Is errno %v, Is ECONNREFUSED %v, Timeout %v, Temporary %v; want true, false, %v, %v",
				c.errno, errors.Is(e, c.errno), errors.Is(e, syscall.ECONNREFUSED), e.Timeout(), e.Temporary(), c.timeout, c.timeout)
		}
		op := &OpError{Op: "dial", Addr: "10.0.0.9:7000", Err: e}
		if op.Timeout() != c.timeout || op.Temporary() != c.timeout {
			t.Errorf("OpError around unanswered (%v): Timeout %v, want %v", c.errno, op.Timeout(), c.timeout)
		}
	}
}
