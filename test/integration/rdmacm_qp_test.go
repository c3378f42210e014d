//go:build linux && cgo

package integration

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/objtrace"
	"github.com/goxrc/goxrc/rdmacm"
	"github.com/goxrc/goxrc/verbs"
)

// rdmacmEndpoint is the verbs side of one end: PD, CQ with its channel, an
// RC QP and one registered buffer.
type rdmacmEndpoint struct {
	pd  *verbs.PD
	ch  *verbs.CompChannel
	cq  *verbs.CQ
	qp  *verbs.QP
	mr  *verbs.MR
	all []interface{ Close() error } // in creation order
}

func rdmacmNewEndpoint(t *testing.T, vc *verbs.Context) *rdmacmEndpoint {
	t.Helper()
	e := &rdmacmEndpoint{}
	check := func(c interface{ Close() error }, err error) {
		t.Helper()
		if err != nil {
			e.close(t)
			t.Fatal(err)
		}
		e.all = append(e.all, c)
	}
	var err error
	e.pd, err = vc.AllocPD()
	check(e.pd, err)
	e.ch, err = vc.NewCompChannel()
	check(e.ch, err)
	e.cq, err = vc.CreateCQ(16, e.ch, 0)
	check(e.cq, err)
	e.qp, err = e.pd.CreateQP(verbs.QPInit{Type: verbs.QPTypeRC, SendCQ: e.cq, RecvCQ: e.cq,
		Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	check(e.qp, err)
	e.mr, err = e.pd.RegMR(4096, verbs.AccessLocalWrite|verbs.AccessRemoteWrite|verbs.AccessRemoteRead)
	check(e.mr, err)
	return e
}

// close releases what was created, last first.
func (e *rdmacmEndpoint) close(t *testing.T) {
	t.Helper()
	for i := len(e.all) - 1; i >= 0; i-- {
		if err := e.all[i].Close(); err != nil {
			t.Errorf("close %T: %v", e.all[i], err)
		}
	}
	e.all = nil
}

// rdmacmMove moves qp to state with the CM's attributes.
func rdmacmMove(t *testing.T, id *rdmacm.ID, qp *verbs.QP, state verbs.QPState, p rdmacm.MoveParams) {
	t.Helper()
	attr, mask, err := id.InitQPAttr(state)
	if err != nil {
		t.Fatalf("InitQPAttr(%v): %v", state, err)
	}
	if state == verbs.QPStateRTR {
		attr.MinRNRTimer = 12 // rdma_init_qp_attr gives 0, a 655 ms back-off
		mask |= verbs.QPAttrMinRNRTimer
		if p.ResponderResources > 0 {
			attr.MaxDestRdAtomic = p.ResponderResources
		}
	}
	if state == verbs.QPStateRTS && p.InitiatorDepth > 0 {
		attr.MaxQPRdAtomic = p.InitiatorDepth
	}
	if err := qp.Modify(&attr, mask); err != nil {
		t.Fatalf("Modify to %v (mask %v): %v", state, mask, err)
	}
}

func rdmacmWaitWC(t *testing.T, cq *verbs.CQ, want verbs.WCOpcode) verbs.WorkCompletion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	wcs := make([]verbs.WorkCompletion, 4)
	n, err := cq.Wait(ctx, wcs)
	if err != nil {
		t.Fatalf("waiting for %v completion: %v", want, err)
	}
	if n != 1 || wcs[0].Err() != nil || wcs[0].Opcode != want {
		t.Fatalf("completions %+v", wcs[:n])
	}
	return wcs[0]
}

// qpMover moves a connection's QP to a later state with the CM's attributes
// (but p's).
type qpMover func(t *testing.T, id *rdmacm.ID, qp *verbs.QP, to verbs.QPState, p rdmacm.MoveParams)

// rdmacmQPState returns the state the device reports for qp.
func rdmacmQPState(t *testing.T, qp *verbs.QP) verbs.QPState {
	t.Helper()
	attr, _, err := qp.Query(verbs.QPAttrState)
	if err != nil {
		t.Fatal(err)
	}
	return attr.State
}

// TestRDMACMRCWithQPs connects two RC QPs that verbs created, through the
// CM, sends a message each way and reads and writes each side's memory from
// the other: once moving the QPs one state at a time (InitQPAttr, then
// Modify), once with MoveQP, which makes the same calls in one C call. The
// active side asks for 4 reads in flight each way and the passive side
// grants 1: both QPs must hold 1. (The active side's QP kept INIT's access
// flags from before Connect, 0, until INIT was applied again after the
// reply: the passive side's first write into its memory failed.)
func TestRDMACMRCWithQPs(t *testing.T) {
	stepwise := func(t *testing.T, id *rdmacm.ID, qp *verbs.QP, to verbs.QPState, p rdmacm.MoveParams) {
		t.Helper()
		from := rdmacmQPState(t, qp)
		if from == verbs.QPStateInit && to > from {
			from-- // INIT again first (see the package doc)
		}
		for s := from + 1; s <= to; s++ {
			rdmacmMove(t, id, qp, s, p)
		}
	}
	oneCall := func(t *testing.T, id *rdmacm.ID, qp *verbs.QP, to verbs.QPState, p rdmacm.MoveParams) {
		t.Helper()
		p.MinRNRTimer = 12
		if err := id.MoveQP(qp, to, p); err != nil {
			t.Fatalf("MoveQP(%v): %v", to, err)
		}
		if got := rdmacmQPState(t, qp); got != to {
			t.Fatalf("after MoveQP(%v) the QP is in %v", to, got)
		}
	}
	t.Run("stepwise", func(t *testing.T) { rdmacmRCWithQPs(t, 20108, stepwise, 7) })
	t.Run("MoveQP", func(t *testing.T) { rdmacmRCWithQPs(t, 20111, oneCall, rdmacm.RetryCountFinite) })
}

// rdmacmRCWithQPs connects with a transport retry count of 7 on the active
// side, which the passive side's request carries; wantRetry is what both
// QPs then hold (MoveQP lowers 7 to RetryCountFinite).
func rdmacmRCWithQPs(t *testing.T, port uint16, move qpMover, wantRetry uint8) {
	_, ip := rdmacmEnv(t)
	// The counts at the end are compared with these: an earlier test's
	// leak is not this one's (TestZZNothingLeaked reports it).
	start := verbs.Counts()
	ch := rdmacmChannel(t)
	addr := netip.AddrPortFrom(ip, port)
	l := rdmacmListen(t, ch, rdmacm.PortSpaceTCP, verbs.QPTypeRC, addr)
	vc := l.VerbsContext() // one wrapper for the device, used by both ends
	if vc == nil {
		t.Fatal("listener bound to the device has no Context")
	}
	defer func() {
		if err := vc.Close(); err != nil {
			t.Errorf("context wrapper: %v", err)
		}
		if c := verbs.Counts(); c != start {
			t.Errorf("verbs objects left: %+v (at the start %+v)\n%s", c, start, objtrace.Report())
		}
	}()
	srvEP := rdmacmNewEndpoint(t, vc)
	defer srvEP.close(t)
	cliEP := rdmacmNewEndpoint(t, vc)
	defer cliEP.close(t)

	// Active side: route, QP to INIT, REQ.
	cli := rdmacmResolved(t, ch, rdmacm.PortSpaceTCP, verbs.QPTypeRC, addr)
	move(t, cli, cliEP.qp, verbs.QPStateInit, rdmacm.MoveParams{})
	if err := cli.Connect(rdmacm.ConnParam{QPNum: cliEP.qp.Num(), ResponderResources: 4, InitiatorDepth: 4, RetryCount: 7, RNRRetryCount: 7}); err != nil {
		t.Fatal(err)
	}

	// Passive side: QP to INIT, RTR, RTS, a receive posted, then Accept.
	e := rdmacmWait(t, l, rdmacm.EventConnectRequest)
	srv := e.ID
	defer srv.Close()
	if e.Conn.QPNum != cliEP.qp.Num() {
		t.Fatalf("request names QP %#x, want %#x", e.Conn.QPNum, cliEP.qp.Num())
	}
	granted := rdmacm.MoveParams{ResponderResources: 1, InitiatorDepth: 1}
	move(t, srv, srvEP.qp, verbs.QPStateInit, granted)
	if err := srvEP.qp.PostRecv([]verbs.RecvWR{{ID: 1, SGL: []verbs.SGE{srvEP.mr.SGE(0, 4096)}}}); err != nil {
		t.Fatal(err)
	}
	move(t, srv, srvEP.qp, verbs.QPStateRTS, granted)
	if err := srv.Accept(rdmacm.ConnParam{QPNum: srvEP.qp.Num(), ResponderResources: 1, InitiatorDepth: 1, RNRRetryCount: 7}); err != nil {
		t.Fatal(err)
	}

	// Active side: REP, QP to RTR and RTS, RTU.
	e = rdmacmWait(t, cli, rdmacm.EventConnectResponse)
	if e.Conn.QPNum != srvEP.qp.Num() {
		t.Fatalf("reply names QP %#x, want %#x", e.Conn.QPNum, srvEP.qp.Num())
	}
	if err := cliEP.qp.PostRecv([]verbs.RecvWR{{ID: 2, SGL: []verbs.SGE{cliEP.mr.SGE(0, 4096)}}}); err != nil {
		t.Fatal(err)
	}
	move(t, cli, cliEP.qp, verbs.QPStateRTS, rdmacm.MoveParams{})
	if err := cli.Establish(); err != nil {
		t.Fatal(err)
	}
	rdmacmWait(t, srv, rdmacm.EventEstablished)
	for _, ep := range []*rdmacmEndpoint{cliEP, srvEP} {
		attr, _, err := ep.qp.Query(verbs.QPAttrRetryCnt | verbs.QPAttrAccessFlags | verbs.QPAttrMaxQPRdAtomic | verbs.QPAttrMaxDestRdAtomic)
		if err != nil {
			t.Fatal(err)
		}
		if attr.RetryCnt != wantRetry {
			t.Errorf("QP %#x: retry count %d, want %d", ep.qp.Num(), attr.RetryCnt, wantRetry)
		}
		if want := verbs.AccessRemoteWrite | verbs.AccessRemoteRead; attr.AccessFlags&want != want {
			t.Errorf("QP %#x: access flags %#x, want remote write and read", ep.qp.Num(), attr.AccessFlags)
		}
		if attr.MaxQPRdAtomic != 1 || attr.MaxDestRdAtomic != 1 {
			t.Errorf("QP %#x: %d reads in flight out, %d in; want the 1 and 1 granted", ep.qp.Num(), attr.MaxQPRdAtomic, attr.MaxDestRdAtomic)
		}
	}

	send := func(from, to *rdmacmEndpoint, msg []byte) {
		t.Helper()
		copy(from.mr.Bytes(), msg)
		if err := from.qp.PostSend([]verbs.SendWR{{ID: 10, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{from.mr.SGE(0, len(msg))}}}); err != nil {
			t.Fatal(err)
		}
		rdmacmWaitWC(t, from.cq, verbs.WCSend)
		wc := rdmacmWaitWC(t, to.cq, verbs.WCRecv)
		if got := to.mr.Bytes()[:wc.ByteLen]; !bytes.Equal(got, msg) {
			t.Fatalf("received %q, want %q", got, msg)
		}
	}
	send(cliEP, srvEP, []byte("hello over an RC QP connected by rdmacm"))
	send(srvEP, cliEP, bytes.Repeat([]byte{0x5a, 0xa5}, 1000))
	// One-sided, each way: write into the far half of the peer's memory,
	// then read it back into the near half's end.
	oneSided := func(from, to *rdmacmEndpoint, msg string) {
		t.Helper()
		copy(from.mr.Bytes(), msg)
		for _, wr := range []verbs.SendWR{
			{ID: 11, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled, SGL: []verbs.SGE{from.mr.SGE(0, len(msg))},
				RemoteAddr: to.mr.Addr() + 2048, RKey: to.mr.RKey()},
			{ID: 12, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled, SGL: []verbs.SGE{from.mr.SGE(1024, len(msg))},
				RemoteAddr: to.mr.Addr() + 2048, RKey: to.mr.RKey()},
		} {
			if err := from.qp.PostSend([]verbs.SendWR{wr}); err != nil {
				t.Fatal(err)
			}
			rdmacmWaitWC(t, from.cq, map[verbs.WROpcode]verbs.WCOpcode{verbs.WRRDMAWrite: verbs.WCRDMAWrite, verbs.WRRDMARead: verbs.WCRDMARead}[wr.Opcode])
		}
		if got := string(to.mr.Bytes()[2048 : 2048+len(msg)]); got != msg {
			t.Fatalf("written %q, want %q", got, msg)
		}
		if got := string(from.mr.Bytes()[1024 : 1024+len(msg)]); got != msg {
			t.Fatalf("read back %q, want %q", got, msg)
		}
	}
	oneSided(cliEP, srvEP, "active side's write")
	oneSided(srvEP, cliEP, "passive side's write")

	// MoveQP never moves a QP backwards or out of the connection states,
	// and a refused move leaves the QP as it was.
	for _, to := range []verbs.QPState{verbs.QPStateInit, verbs.QPStateRTR, verbs.QPStateErr, verbs.QPStateReset} {
		if err := cli.MoveQP(cliEP.qp, to, rdmacm.MoveParams{}); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("MoveQP(%v) of an RTS QP: %v, want EINVAL", to, err)
		}
	}
	if err := cli.MoveQP(cliEP.qp, verbs.QPStateRTS, rdmacm.MoveParams{}); err != nil {
		t.Errorf("MoveQP(RTS) of an RTS QP: %v, want nothing to do", err)
	}
	if got := rdmacmQPState(t, cliEP.qp); got != verbs.QPStateRTS {
		t.Errorf("after refused moves the QP is in %v", got)
	}
	closed, err := cliEP.pd.CreateQP(verbs.QPInit{Type: verbs.QPTypeRC, SendCQ: cliEP.cq, RecvCQ: cliEP.cq,
		Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	if err != nil {
		t.Fatal(err)
	}
	closed.Close()
	if err := cli.MoveQP(closed, verbs.QPStateInit, rdmacm.MoveParams{}); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("MoveQP of a closed QP: %v, want ErrClosed", err)
	}
	if err := srvEP.qp.PostRecv([]verbs.RecvWR{{ID: 3, SGL: []verbs.SGE{srvEP.mr.SGE(0, 4096)}}}); err != nil {
		t.Fatal(err)
	}
	send(cliEP, srvEP, []byte("still connected"))

	if err := cli.Disconnect(); err != nil {
		t.Fatal(err)
	}
	rdmacmWait(t, srv, rdmacm.EventDisconnected)
	srv.Disconnect()
	rdmacmWait(t, cli, rdmacm.EventDisconnected)
	rdmacmWait(t, cli, rdmacm.EventTimewaitExit)
	rdmacmWait(t, srv, rdmacm.EventTimewaitExit)
}
