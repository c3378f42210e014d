//go:build linux && cgo

package integration

import (
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/goxrc/goxrc/rdmacm"
	"github.com/goxrc/goxrc/verbs"
)

// TestRDMACMCloseNeverWaitsForQueuedEvents: librdmacm's rdma_destroy_id
// blocks until every event of the id that rdma_get_cm_event handed out has
// been acknowledged (cma.c: events_completed against the kernel's
// events_reported). The pump acknowledges each event as it reads it, before
// it queues the copy, so no Close may ever wait on an event: not on events
// queued and never read (the client ids below), not on an unclaimed
// CONNECT_REQUEST (its new id and the listener), and not when the Close
// races the pump's read and acknowledgement of that id's own events (the
// server ids, closed while their DISCONNECTED arrive). Each Close runs under
// a watchdog; a Close that blocks fails the test instead of hanging it.
func TestRDMACMCloseNeverWaitsForQueuedEvents(t *testing.T) {
	_, ip := rdmacmEnv(t)
	before := rdmacm.Counts()
	ch := rdmacmChannel(t)
	addr := netip.AddrPortFrom(ip, 20114)
	l, err := ch.CreateID(rdmacm.PortSpaceTCP, verbs.QPTypeRC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() }) // closed below; this on a failure
	if err := l.Bind(addr); err != nil {
		t.Fatal(err)
	}
	if err := l.Listen(16); err != nil {
		t.Fatal(err)
	}
	closeWithin := func(what string, id *rdmacm.ID) {
		t.Helper()
		done := make(chan error, 1)
		go func() { done <- id.Close() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Close of %s: %v", what, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("Close of %s blocked (rdma_destroy_id waiting for an unacknowledged event?)", what)
		}
	}

	const n = 8
	var clis, srvs []*rdmacm.ID
	for range n {
		cli, srv := rdmacmConnectRC(t, ch, l, addr, rdmacmNextQPN(), rdmacmNextQPN())
		clis, srvs = append(clis, cli), append(srvs, srv)
	}
	// One more request that nobody claims: its CONNECT_REQUEST stays on
	// the listener's queue with its new id.
	extra := rdmacmResolved(t, ch, rdmacm.PortSpaceTCP, verbs.QPTypeRC, addr)
	if err := extra.Connect(rdmacm.ConnParam{QPNum: rdmacmNextQPN()}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for l.Pending() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if l.Pending() == 0 {
		t.Fatal("the unclaimed CONNECT_REQUEST never arrived")
	}

	// The clients disconnect: each server id gets DISCONNECTED, which the
	// pump reads while the server ids are being closed, all at once.
	for _, c := range clis {
		if err := c.Disconnect(); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for i, s := range srvs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i%2 == 0 {
				time.Sleep(time.Duration(i) * 100 * time.Microsecond)
			}
			closeWithin("a server id racing its DISCONNECTED", s)
		}()
	}
	wg.Wait()

	// The clients' DISCONNECTED (and later TIMEWAIT_EXIT) stay queued,
	// never read, as the ids close.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, c := range clis {
		for c.Pending() == 0 && ctx.Err() == nil {
			time.Sleep(10 * time.Millisecond)
		}
		closeWithin("a client id with queued events", c)
	}
	closeWithin("the listener with an unclaimed request", l)
	if _, err := extra.WaitEvent(rdmacmCtx(t, 10*time.Second), rdmacm.EventConnectResponse); err == nil {
		t.Error("the unclaimed request was answered after its listener closed")
	}
	closeWithin("the rejected client", extra)
	if c := rdmacm.Counts(); c.IDs != before.IDs {
		t.Errorf("ids after closing everything: %+v, before %+v", c, before)
	}
}
