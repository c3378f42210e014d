//go:build linux && cgo

package rdmacm

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/goxrc/goxrc/verbs"
)

// A broken event channel's errors name the failed read once: Event said
// "rdma_get_cm_event: rdma_get_cm_event: input/output error" (the pump's
// *verbs.OpError inside Event's own, of the same call), and CreateID on the
// channel "rdma_create_id: input/output error", as if rdma_create_id had
// failed with EIO, when no C call was made and the channel's read had.
func TestBrokenChannelErrorsNameTheReadOnce(t *testing.T) {
	c, ids := brokenPumpChannel(t, 1, nil)
	id := ids[0]
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	_, err := id.Event(ctx)
	check := func(what string, err error, want string) {
		t.Helper()
		if err == nil || err.Error() != want {
			t.Errorf("%s: %v, want %q", what, err, want)
		}
		if !errors.Is(err, syscall.EIO) {
			t.Errorf("%s: %v does not match EIO", what, err)
		}
	}
	check("Event", err, "rdma_get_cm_event: input/output error")
	_, err = id.WaitEvent(ctx, EventEstablished)
	check("WaitEvent", err, "wait ESTABLISHED: rdma_get_cm_event: input/output error")
	check("channel Err", c.Err(), "rdma_get_cm_event: input/output error")
	_, err = c.CreateID(PortSpaceTCP, verbs.QPTypeRC)
	check("CreateID", err, "rdma_create_id: rdma_get_cm_event: input/output error")

	if err := id.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if n := Counts(); n != (Counters{}) {
		t.Fatalf("counts after closing everything: %+v", n)
	}
}
