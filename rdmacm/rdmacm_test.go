package rdmacm

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/goxrc/goxrc/verbs"
)

func TestEventTypeString(t *testing.T) {
	want := []string{
		"ADDR_RESOLVED", "ADDR_ERROR", "ROUTE_RESOLVED", "ROUTE_ERROR", "CONNECT_REQUEST",
		"CONNECT_RESPONSE", "CONNECT_ERROR", "UNREACHABLE", "REJECTED", "ESTABLISHED",
		"DISCONNECTED", "DEVICE_REMOVAL", "MULTICAST_JOIN", "MULTICAST_ERROR", "ADDR_CHANGE",
		"TIMEWAIT_EXIT",
	}
	for i, w := range want {
		if got := EventType(i).String(); got != w {
			t.Errorf("EventType(%d) = %q, want %q", i, got, w)
		}
	}
	if EventTimewaitExit != 15 || EventRejected != 8 || EventConnectResponse != 5 {
		t.Fatal("event numbering differs from enum rdma_cm_event_type")
	}
	if got := EventType(16).String(); got != "EventType(16)" {
		t.Errorf("unknown: %q", got)
	}
	if got := EventType(-1).String(); got != "EventType(-1)" {
		t.Errorf("negative: %q", got)
	}
}

func TestPortSpace(t *testing.T) {
	for ps, w := range map[PortSpace]string{PortSpaceTCP: "TCP", PortSpaceUDP: "UDP", PortSpaceIB: "IB", PortSpaceIPoIB: "IPOIB", 7: "PortSpace(0x7)"} {
		if ps.String() != w {
			t.Errorf("%#x: %q want %q", uint16(ps), ps.String(), w)
		}
	}
	if PortSpaceTCP != 0x106 || PortSpaceUDP != 0x111 || PortSpaceIB != 0x13f {
		t.Fatal("port space values differ from enum rdma_port_space")
	}
}

func TestPrivateDataBudgets(t *testing.T) {
	budgets := map[string]int{"req": MaxReqPrivateData, "rep": MaxRepPrivateData, "rej": MaxRejPrivateData,
		"sidr req": MaxSIDRReqPrivateData, "sidr rep": MaxSIDRRepPrivateData}
	want := map[string]int{"req": 56, "rep": 196, "rej": 148, "sidr req": 180, "sidr rep": 136}
	for k, v := range budgets {
		if v != want[k] {
			t.Errorf("%s budget %d, want %d", k, v, want[k])
		}
		if err := checkPrivateData("op", v, make([]byte, v)); err != nil {
			t.Errorf("%s: %d bytes refused: %v", k, v, err)
		}
		err := checkPrivateData("rdma_x", v, make([]byte, v+1))
		if !errors.Is(err, ErrPrivateDataTooLong) {
			t.Fatalf("%s: %d bytes: %v", k, v+1, err)
		}
		var pe *PrivateDataError
		if !errors.As(err, &pe) || pe.Limit != v || pe.Len != v+1 || pe.Op != "rdma_x" {
			t.Fatalf("%s: %#v", k, pe)
		}
		if !strings.Contains(err.Error(), "rdma_x") || !strings.Contains(err.Error(), "limit is") {
			t.Errorf("message %q", err)
		}
	}
	if checkPrivateData("op", 56, nil) != nil {
		t.Error("nil private data refused")
	}
}

func TestRejectError(t *testing.T) {
	cases := []struct {
		e       RejectError
		reason  string
		stale   bool
		timeout bool
		refused bool // matches syscall.ECONNREFUSED
	}{
		{RejectError{Type: EventRejected, Status: 10}, "stale connection", true, false, true},
		{RejectError{Type: EventRejected, Status: 28}, "consumer defined", false, false, true},
		{RejectError{Type: EventRejected, Status: 8}, "invalid service id (no listener)", false, false, true},
		{RejectError{Type: EventUnreachable, Status: 2, UD: true}, "rejected", false, false, true},
		{RejectError{Type: EventUnreachable, Status: 1, UD: true}, "service not supported (no listener)", false, false, true},
		{RejectError{Type: EventUnreachable, Status: -int(syscall.ETIMEDOUT)}, syscall.ETIMEDOUT.Error(), false, true, false},
		{RejectError{Type: EventUnreachable, Status: 3}, "no resources", false, false, false},
		{RejectError{Type: EventRejected, Status: 99}, "status 99", false, false, true},
	}
	for _, c := range cases {
		var err error = &c.e
		if c.e.Reason() != c.reason || c.e.Stale() != c.stale || c.e.Timeout() != c.timeout {
			t.Errorf("%v: reason %q stale %v timeout %v", err, c.e.Reason(), c.e.Stale(), c.e.Timeout())
		}
		var ne net.Error
		if !errors.As(err, &ne) || ne.Timeout() != c.timeout {
			t.Errorf("%v: not a net.Error with the right Timeout", err)
		}
		if !strings.Contains(err.Error(), c.reason) {
			t.Errorf("message %q lacks %q", err, c.reason)
		}
		if got := errors.Is(fmt.Errorf("dial: %w", err), syscall.ECONNREFUSED); got != c.refused {
			t.Errorf("%v: matches ECONNREFUSED %v, want %v", err, got, c.refused)
		}
		if got := errors.Is(err, syscall.ETIMEDOUT); got != c.timeout {
			t.Errorf("%v: matches ETIMEDOUT %v, want %v", err, got, c.timeout)
		}
	}
	if s := (&RejectError{Type: EventUnreachable, Status: 2, UD: true}).Error(); !strings.Contains(s, "SIDR") {
		t.Errorf("SIDR reject message %q", s)
	}
}

func TestEventError(t *testing.T) {
	udID := &ID{qpType: verbs.QPTypeUD}
	err := eventError(Event{Type: EventUnreachable, Status: 2, ID: udID, PrivateData: []byte{1}}, EventEstablished, "")
	var re *RejectError
	if !errors.As(err, &re) || !re.UD || re.Status != 2 || len(re.PrivateData) != 1 {
		t.Fatalf("UNREACHABLE: %v", err)
	}
	err = eventError(Event{Type: EventAddrError, Status: -int(syscall.ETIMEDOUT)}, EventAddrResolved, "10.0.0.9:1")
	var oe *verbs.OpError
	if !errors.As(err, &oe) || oe.Op != "rdma_resolve_addr" || !oe.Timeout() || !errors.Is(err, syscall.ETIMEDOUT) {
		t.Fatalf("ADDR_ERROR: %v", err)
	}
	err = eventError(Event{Type: EventRouteError, Status: -int(syscall.ENETUNREACH)}, EventRouteResolved, "")
	if !errors.Is(err, syscall.ENETUNREACH) {
		t.Fatalf("ROUTE_ERROR: %v", err)
	}
	err = eventError(Event{Type: EventConnectError, Status: -int(syscall.ECONNRESET)}, EventConnectResponse, "")
	if !errors.As(err, &oe) || oe.Op != "rdma_connect" {
		t.Fatalf("CONNECT_ERROR: %v", err)
	}
	err = eventError(Event{Type: EventDisconnected}, EventEstablished, "")
	var ue *UnexpectedEventError
	if !errors.As(err, &ue) || ue.Want != EventEstablished || ue.Event.Type != EventDisconnected {
		t.Fatalf("unexpected: %v", err)
	}
}

// A resolution the kernel timed out (ADDR_ERROR or ROUTE_ERROR, ETIMEDOUT)
// under a ctx with a deadline ran out of that deadline: the kernel's timeout
// was the deadline's less a margin (kernelTimeout), so the error matches
// context.DeadlineExceeded and os.ErrDeadlineExceeded, as when ctx's end
// comes first, besides ETIMEDOUT; also through a caller's OpError (cm's
// Dial wraps it so). It matched ETIMEDOUT alone, so that what a Dial with a
// deadline said depended on whether the kernel or ctx spoke first. Without
// a deadline the timeout is the CM's own (DefaultResolveTimeout): ETIMEDOUT
// only. Other errnos are left as they are.
func TestResolveTimeoutMatchesTheDeadline(t *testing.T) {
	withDL, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, c := range []struct {
		ev   EventType
		want EventType
		op   string
	}{{EventAddrError, EventAddrResolved, "rdma_resolve_addr"}, {EventRouteError, EventRouteResolved, "rdma_resolve_route"}} {
		kernel := func() error {
			return eventError(Event{Type: c.ev, Status: -int(syscall.ETIMEDOUT)}, c.want, "10.0.0.9:1")
		}
		err := &verbs.OpError{Op: "dial", Addr: "10.0.0.9:1", Err: deadlineTimeout(withDL, kernel())}
		var oe *verbs.OpError
		if !errors.As(err.Err, &oe) || oe.Op != c.op || !strings.Contains(err.Error(), "10.0.0.9:1") {
			t.Errorf("%s: %v, want the resolution's OpError naming the address", c.op, err)
		}
		for _, target := range []error{context.DeadlineExceeded, os.ErrDeadlineExceeded, syscall.ETIMEDOUT} {
			if !errors.Is(err, target) {
				t.Errorf("%s with a deadline: %v does not match %v", c.op, err, target)
			}
		}
		if !err.Timeout() {
			t.Errorf("%s with a deadline: %v is not a Timeout", c.op, err)
		}
		plain := deadlineTimeout(context.Background(), kernel())
		if !errors.Is(plain, syscall.ETIMEDOUT) || errors.Is(plain, context.DeadlineExceeded) || errors.Is(plain, os.ErrDeadlineExceeded) {
			t.Errorf("%s without a deadline: %v, want ETIMEDOUT and no deadline", c.op, plain)
		}
		other := eventError(Event{Type: c.ev, Status: -int(syscall.ENETUNREACH)}, c.want, "")
		if got := deadlineTimeout(withDL, other); got != other {
			t.Errorf("%s, ENETUNREACH: %v changed to %v", c.op, other, got)
		}
	}
}

func TestNewEventChannelHost(t *testing.T) {
	ch, err := NewEventChannel()
	if err == nil {
		// A machine with RDMA: the channel must open and close cleanly.
		if err := ch.Close(); err != nil {
			t.Fatal(err)
		}
		if err := ch.Close(); err != nil {
			t.Fatal("second Close:", err)
		}
		if c := Counts(); c.Channels != 0 || c.IDs != 0 {
			t.Fatalf("counts %+v", c)
		}
		return
	}
	var oe *verbs.OpError
	if !errors.As(err, &oe) || oe.Op != "rdma_create_event_channel" {
		t.Fatalf("error %v (%T) does not name rdma_create_event_channel", err, err)
	}
	t.Logf("no RDMA CM on this machine: %v", err)
	if _, statErr := os.Stat("/dev/infiniband/rdma_cm"); statErr == nil {
		t.Log("(/dev/infiniband/rdma_cm exists)")
	}
	if c := Counts(); c.Channels != 0 || c.IDs != 0 {
		t.Fatalf("counts after failure %+v", c)
	}
}

func TestNilAndZeroObjects(t *testing.T) {
	ctx := context.Background()
	var ch *EventChannel
	if _, err := ch.CreateID(PortSpaceTCP, verbs.QPTypeRC); !errors.Is(err, ErrClosed) {
		t.Errorf("nil channel CreateID: %v", err)
	}
	if _, err := ch.CreateEndpoint(ctx, PortSpaceIB, verbs.QPTypeXRCRecv, netip.MustParseAddrPort("10.0.0.1:1"), true); !errors.Is(err, ErrClosed) {
		t.Errorf("nil channel CreateEndpoint: %v", err)
	}
	if err := ch.Close(); err != nil {
		t.Errorf("nil channel Close: %v", err)
	}
	// A zero channel was never opened: its Close hung (waiting for a pump
	// that never ran) and CreateID panicked (a nil map).
	zero := &EventChannel{}
	if _, err := zero.CreateID(PortSpaceTCP, verbs.QPTypeRC); !errors.Is(err, ErrClosed) {
		t.Errorf("zero channel CreateID: %v", err)
	}
	closed := make(chan error, 1)
	go func() { closed <- zero.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("zero channel Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("zero channel Close hangs")
	}
	for name, id := range map[string]*ID{"nil": nil, "zero": {}} {
		a := netip.MustParseAddrPort("10.0.0.1:1")
		errs := map[string]error{
			"Bind":         id.Bind(a),
			"ResolveAddr":  id.ResolveAddr(ctx, netip.AddrPort{}, a),
			"ResolveRoute": id.ResolveRoute(ctx),
			"Listen":       id.Listen(1),
			"Connect":      id.Connect(ConnParam{}),
			"Accept":       id.Accept(ConnParam{}),
			"Reject":       id.Reject(nil),
			"Establish":    id.Establish(),
			"Disconnect":   id.Disconnect(),
		}
		_, _, errs["InitQPAttr"] = id.InitQPAttr(verbs.QPStateRTR)
		errs["MoveQP"] = id.MoveQP(nil, verbs.QPStateRTR, MoveParams{MinRNRTimer: 12})
		_, errs["Event"] = id.Event(ctx)
		_, errs["WaitEvent"] = id.WaitEvent(ctx, EventEstablished)
		for op, err := range errs {
			if !errors.Is(err, ErrClosed) {
				t.Errorf("%s ID %s: %v", name, op, err)
			}
		}
		if id.DeviceName() != "" || id.Port() != 0 || id.LocalAddr().IsValid() || id.RemoteAddr().IsValid() || id.Pending() != 0 {
			t.Errorf("%s ID getters not zero", name)
		}
		if err := id.Close(); err != nil {
			t.Errorf("%s ID Close: %v", name, err)
		}
	}
	var id *ID
	if id.PortSpace() != 0 || id.QPType() != 0 || id.Channel() != nil {
		t.Error("nil ID accessors")
	}
}

func TestCreateIDValidation(t *testing.T) {
	c := &EventChannel{ids: map[uintptr]*ID{}}
	for _, bad := range []struct {
		ps PortSpace
		qt verbs.QPType
	}{{PortSpaceTCP, verbs.QPTypeUD}, {PortSpaceUDP, verbs.QPTypeRC}, {PortSpaceIB, verbs.QPTypeXRCSend}, {7, verbs.QPTypeRC}} {
		if _, err := c.CreateID(bad.ps, bad.qt); err == nil || errors.Is(err, ErrClosed) {
			t.Errorf("%v/%v: %v", bad.ps, bad.qt, err)
		}
	}
	if _, err := c.CreateEndpoint(context.Background(), PortSpaceIB, verbs.QPTypeXRCRecv, netip.AddrPort{}, true); err == nil {
		t.Error("CreateEndpoint with an invalid address succeeded")
	}
	for _, active := range []func() (*ID, error){
		func() (*ID, error) {
			return c.CreateEndpoint(context.Background(), PortSpaceIB, verbs.QPTypeXRCSend, netip.AddrPort{}, false)
		},
		func() (*ID, error) {
			return c.CreateEndpointFrom(context.Background(), PortSpaceIB, verbs.QPTypeXRCSend, netip.MustParseAddr("10.0.0.1"), netip.AddrPort{})
		},
	} {
		if _, err := active(); err == nil || errors.Is(err, ErrClosed) {
			t.Errorf("active endpoint to no address: %v", err)
		}
	}
}

func TestKernelTimeout(t *testing.T) {
	if got := kernelTimeout(context.Background()); got != 2000 {
		t.Errorf("default %d", got)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if got := kernelTimeout(ctx); got < 380 || got > 450 {
		t.Errorf("500ms deadline gave %d", got)
	}
	ctx3, cancel3 := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel3()
	if got := kernelTimeout(ctx3); got < 9700 || got > 9750 {
		t.Errorf("10s deadline gave %d", got)
	}
	ctx2, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	if got := kernelTimeout(ctx2); got != 1 {
		t.Errorf("past deadline gave %d", got)
	}
}

// A backlog past rdma_listen's int means the kernel's bound, as one over
// net.rdma_ucm.max_backlog does, rather than wrapping to a small one.
func TestKernelBacklog(t *testing.T) {
	for _, c := range []struct {
		in   int64
		want int32
	}{
		{0, 0}, {-1, -1}, {128, 128}, {math.MaxInt32, math.MaxInt32},
		{math.MaxInt32 + 1, math.MaxInt32}, {1<<32 + 5, math.MaxInt32}, {math.MaxInt64, math.MaxInt32},
		// Below rdma_listen's int: 0 or less means the kernel's bound
		// too, so a negative one must not wrap to a small positive one
		// (-2^32+5 was 5, math.MinInt64+5 too) nor to 0 by chance.
		{math.MinInt32, math.MinInt32}, {math.MinInt32 - 1, math.MinInt32},
		{-(1 << 32) + 5, math.MinInt32}, {math.MinInt64 + 5, math.MinInt32}, {math.MinInt64, math.MinInt32},
	} {
		n := int(c.in)
		if int64(n) != c.in {
			continue // past a 32-bit int, so no caller can pass it
		}
		if got := kernelBacklog(n); got != c.want {
			t.Errorf("kernelBacklog(%d) = %d, want %d", n, got, c.want)
		}
	}
}

func TestQueueOrderAndClose(t *testing.T) {
	var q eventQueue
	q.init()
	const n = 10000 // never blocks the producer
	for i := 0; i < n; i++ {
		if !q.push(Event{Status: i}) {
			t.Fatal("push refused")
		}
	}
	for i := 0; i < n; i++ {
		e, err := q.pop(context.Background())
		if err != nil || e.Status != i {
			t.Fatalf("pop %d: %v %v", i, e.Status, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := q.pop(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("empty pop: %v", err)
	}

	// Close wakes every waiter; events queued before a non-dropping close
	// are still delivered first.
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := q.pop(context.Background())
			errs <- err
		}()
	}
	time.Sleep(10 * time.Millisecond)
	q.close(ErrClosed, false)
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, ErrClosed) {
			t.Fatalf("waiter got %v", err)
		}
	}
	if q.push(Event{}) {
		t.Fatal("push after close accepted")
	}

	var q2 eventQueue
	q2.init()
	q2.push(Event{Status: 1})
	q2.close(ErrClosed, false)
	if e, err := q2.pop(context.Background()); err != nil || e.Status != 1 {
		t.Fatalf("queued event lost: %v %v", e, err)
	}
	if _, err := q2.pop(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("after drain: %v", err)
	}

	var q3 eventQueue
	q3.init()
	q3.push(Event{Status: 7})
	if rest := q3.close(ErrClosed, true); len(rest) != 1 || rest[0].Status != 7 {
		t.Fatalf("drop returned %v", rest)
	}
	if _, err := q3.pop(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("after drop: %v", err)
	}
}

func TestQueueConcurrent(t *testing.T) {
	var q eventQueue
	q.init()
	const n = 2000
	go func() {
		for i := 0; i < n; i++ {
			q.push(Event{Status: i})
		}
	}()
	for i := 0; i < n; i++ {
		e, err := q.pop(context.Background())
		if err != nil || e.Status != i {
			t.Fatalf("pop %d: %v %v", i, e.Status, err)
		}
	}
}

func TestCountsZero(t *testing.T) {
	if c := Counts(); c != (Counters{}) {
		t.Fatalf("counts %+v", c)
	}
}

// CreateID refuses a UD id on PortSpaceIB, as its doc says (PortSpaceIB
// takes RC): rdma_create_id types an id by its port space alone, RC on
// RDMA_PS_IB, so librdmacm and the kernel made an RC id while the ID
// recorded UD. Its Connect then checked private data against the SIDR REQ's
// 180 bytes (the kernel's REQ takes 56: EINVAL, not ErrPrivateDataTooLong),
// its Accept and Reject refused 137 to 196 (148) bytes that an RC REP (REJ)
// carries, MoveQP refused the RC connection as "a UD id", and QPType and
// RejectError.UD said UD. The channel here is closed, so that nothing
// reaches C either way: before, the pair got through to the ErrClosed check.
func TestCreateIDRefusesWhatRDMACreateIDWouldRetype(t *testing.T) {
	c := &EventChannel{ids: map[uintptr]*ID{}, closed: true}
	_, err := c.CreateID(PortSpaceIB, verbs.QPTypeUD)
	var oe *verbs.OpError
	if !errors.As(err, &oe) || oe.Addr != "IB/UD" || errors.Is(err, ErrClosed) {
		t.Fatalf("CreateID(PortSpaceIB, UD): %v, want a refusal naming IB/UD", err)
	}
	for _, ok := range []struct {
		ps PortSpace
		qt verbs.QPType
	}{{PortSpaceTCP, verbs.QPTypeRC}, {PortSpaceIB, verbs.QPTypeRC}, {PortSpaceUDP, verbs.QPTypeUD}, {PortSpaceIPoIB, verbs.QPTypeUD}} {
		if _, err := c.CreateID(ok.ps, ok.qt); !errors.Is(err, ErrClosed) {
			t.Errorf("CreateID(%v, %v) on a closed channel: %v, want ErrClosed (the pair passes)", ok.ps, ok.qt, err)
		}
	}
}
