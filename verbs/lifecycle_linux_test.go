//go:build linux && cgo

package verbs

import (
	"errors"
	"syscall"
	"testing"
	"time"
)

// Two UD posts naming the same two AHs in opposite orders, while both AHs
// are being closed, must not block each other: each Close waits behind
// one post's hold, and a read lock taken behind a waiting Close waits too.
func TestHoldAHCrossedWithCloses(t *testing.T) {
	a1, a2 := &AH{}, &AH{}
	var s1, s2 sendScratch
	if !s1.holdAH(a1) || !s2.holdAH(a2) {
		t.Fatal("holding open AHs failed")
	}
	closed := make(chan error, 2)
	for _, a := range []*AH{a1, a2} {
		go func() {
			_, err := a.l.beginClose("ibv_destroy_ah", "", "")
			if err == nil {
				a.l.endClose(true)
			}
			closed <- err
		}()
	}
	// Both Closes must be waiting behind the holds before the crossed
	// holds are tried. A fixed sleep here was the test's only guarantee,
	// and a loaded machine (CI's two CPUs under -race) ran the holds
	// first: both succeeded on AHs whose Close had not started yet, and
	// the test failed with nothing wrong in holdAH.
	waitCloseWaiting(t, a1)
	waitCloseWaiting(t, a2)
	held := make(chan [2]bool, 1)
	go func() { held <- [2]bool{s1.holdAH(a2), s2.holdAH(a1)} }()
	select {
	case h := <-held:
		if h[0] && h[1] {
			t.Fatal("both posts took an AH whose Close was waiting")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("posts holding AHs in opposite orders blocked each other behind the Closes")
	}
	s1.releaseAHs()
	s2.releaseAHs()
	for range 2 {
		select {
		case err := <-closed:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Close did not finish after the posts released their AHs")
		}
	}
	if a1.l.tryUse() || a2.l.tryUse() {
		t.Fatal("a closed AH could be used")
	}
}

// waitCloseWaiting returns once a Close of a is waiting for a's lock: a
// read lock can no longer be tried then (sync.RWMutex refuses TryRLock
// while a writer waits), which is what holdAH's tryUse relies on.
func waitCloseWaiting(t *testing.T, a *AH) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for a.l.mu.TryRLock() {
		a.l.mu.RUnlock()
		if time.Now().After(deadline) {
			t.Fatal("the AH's Close never came to wait behind the hold")
		}
		time.Sleep(time.Millisecond)
	}
}

// Some providers return a negative errno from their post calls (siw's
// -ENOMEM for a full queue); the errno must survive, not become EIO.
func TestRCErrNegativeErrno(t *testing.T) {
	for _, c := range []struct {
		rc   int
		err  error
		want syscall.Errno
	}{
		{12, nil, syscall.ENOMEM},
		{-12, nil, syscall.ENOMEM},
		{-22, nil, syscall.EINVAL},
		{-1, syscall.EAGAIN, syscall.EAGAIN},
		{-1, nil, syscall.EIO},
	} {
		if got := returnErr(c.rc, c.err); !errors.Is(got, c.want) {
			t.Errorf("returnErr(%d, %v) = %v, want %v", c.rc, c.err, got, c.want)
		}
	}
	if returnErr(0, syscall.EAGAIN) != nil {
		t.Error("returnErr(0) is not nil")
	}
}

// An opened XRC target QP handle is refused RESET before any C call: mlx5
// would write its doorbell record, which an opened handle lacks. (The
// handle here has no C QP: the refusal must come first.)
func TestOpenedQPRefusesReset(t *testing.T) {
	q := &QP{typ: QPTypeXRCRecv, opened: true, tag: "opened"}
	err := q.Modify(&QPAttr{State: QPStateReset}, QPAttrState)
	var oe *OpError
	if !errors.As(err, &oe) || !errors.Is(err, syscall.EINVAL) {
		t.Fatalf("RESET of an opened handle: %v, want EINVAL", err)
	}
	// Anything else reaches the usual checks (here: a closed QP).
	if err := q.Modify(&QPAttr{State: QPStateErr}, QPAttrState); !errors.Is(err, ErrClosed) {
		t.Fatalf("ERR of a handle without a C QP: %v, want ErrClosed", err)
	}
}
