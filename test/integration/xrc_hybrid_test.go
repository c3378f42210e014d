//go:build linux && cgo

package integration

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net/netip"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/internal/kernel/hybrid"
	"github.com/goxrc/goxrc/internal/kernel/model"
	"github.com/goxrc/goxrc/internal/kernel/real"
	"github.com/goxrc/goxrc/internal/objtrace"
	"github.com/goxrc/goxrc/rdmacm"
	"github.com/goxrc/goxrc/verbs"
)

// The XRC seam on the real CM (soft-RoCE): internal/kernel/hybrid runs the
// XRC-typed and SIDR exchanges through librdmacm while its QPs are the
// model's, numbered from 0x700011 up (hybrid.QPNOffset) so that they collide
// neither with rxe's real QPs nor with the rdmacm tests' 0x2a0000 range.
// Every test shares one hybrid fabric (one model node for the one real node)
// that never reuses a number: a number in a connection that is still in
// TIMEWAIT would be a stale connection for the kernel. Made-up numbers
// outside the model are 0x6f0000-0x6f1fff. Ports 20301-20311.

var xhFabric = sync.OnceValue(func() *hybrid.Fabric { return hybrid.NewFabric(model.ReuseNever) })

func xhEnv(t *testing.T) netip.Addr {
	t.Helper()
	_, ip := rdmacmEnv(t)
	return ip
}

func xhProc(t *testing.T, ip netip.Addr) *hybrid.Process {
	t.Helper()
	p, err := xhFabric().NewProcess(ip)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func xhListen(t *testing.T, k kernel.Kernel, addr netip.AddrPort, ex kernel.Exchange) kernel.ID {
	t.Helper()
	l, err := k.Listen(addr, ex)
	if err != nil {
		t.Fatalf("Listen %s %v: %v", addr, ex, err)
	}
	return l
}

func xhEvent(t *testing.T, k kernel.Kernel, id kernel.ID, want kernel.EventType, d time.Duration) kernel.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	e, err := k.Event(ctx, id)
	if err != nil {
		t.Fatalf("waiting for %v: %v", want, err)
	}
	if e.Type != want {
		t.Fatalf("got %v (status %d), want %v", e.Type, e.Status, want)
	}
	return e
}

func xhNoEvent(t *testing.T, k kernel.Kernel, id kernel.ID, d time.Duration, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	if e, err := k.Event(ctx, id); err == nil {
		t.Errorf("%s: unexpected %v (status %d)", what, e.Type, e.Status)
	}
}

// xhMsg is a stand-in for the engine's wire messages (xrc/internal/wire is
// internal to xrc): a kind, a length and fields, zero-padded by the CM.
func xhMsg(kind string, fields ...uint32) []byte {
	b := append([]byte(kind), 0)
	for _, f := range fields {
		b = binary.BigEndian.AppendUint32(b, f)
	}
	return b
}

func xhCheckPD(t *testing.T, what string, got, sent []byte, budget int) {
	t.Helper()
	if len(got) != budget || !bytes.Equal(got[:len(sent)], sent) || !bytes.Equal(got[len(sent):], make([]byte, budget-len(sent))) {
		t.Errorf("%s: %d bytes %x, want %x zero-padded to %d", what, len(got), got, sent, budget)
	}
}

// xhPhys is one physical link: the INI in cli, a TGT created by srv's
// listener side, the CM ids kept ESTABLISHED.
type xhPhys struct {
	cliID, srvID kernel.ID
	ini, tgt     kernel.QP
	iniN, tgtN   uint32
}

func xhConnectPhys(t *testing.T, cli, srv *hybrid.Process, lx kernel.ID, xrcd kernel.XRCD, addr netip.AddrPort) xhPhys {
	t.Helper()
	ctx := rdmacmCtx(t, 10*time.Second)
	var ph xhPhys
	var err error
	if ph.ini, ph.iniN, err = cli.CreateINI(); err != nil {
		t.Fatal(err)
	}
	if ph.iniN < hybrid.QPNOffset {
		t.Errorf("INI number %#x is below the hybrid range", ph.iniN)
	}
	req := xhMsg("PHYS_REQ", ph.iniN, 0xd0d0)
	if ph.cliID, err = cli.Connect(ctx, addr, kernel.ExchangeXRC, ph.iniN, req); err != nil {
		t.Fatal(err)
	}
	e := xhEvent(t, srv, lx, kernel.EventConnectRequest, 10*time.Second)
	if e.QPNum != ph.iniN || e.Exchange != kernel.ExchangeXRC || e.Remote.Addr() != addr.Addr() {
		t.Errorf("CONNECT_REQUEST: qpn %#x exchange %v from %v; want %#x XRC from %v", e.QPNum, e.Exchange, e.Remote, ph.iniN, addr.Addr())
	}
	xhCheckPD(t, "XRC REQ", e.PrivateData, req, rdmacm.MaxReqPrivateData)
	ph.srvID = e.ID
	if ph.tgt, ph.tgtN, err = srv.CreateTGT(xrcd); err != nil {
		t.Fatal(err)
	}
	if err := srv.TransitionQP(ph.tgt, verbs.QPStateRTS, ph.srvID); err != nil {
		t.Fatal(err)
	}
	rep := xhMsg("PHYS_ACCEPT", ph.tgtN)
	if err := srv.Accept(ph.srvID, ph.tgtN, rep); err != nil {
		t.Fatal(err)
	}
	e = xhEvent(t, cli, ph.cliID, kernel.EventConnectResponse, 10*time.Second)
	if e.QPNum != ph.tgtN {
		t.Errorf("CONNECT_RESPONSE carries %#x, want the TGT %#x", e.QPNum, ph.tgtN)
	}
	xhCheckPD(t, "XRC REP", e.PrivateData, rep, rdmacm.MaxRepPrivateData)
	if err := cli.TransitionQP(ph.ini, verbs.QPStateRTS, ph.cliID); err != nil {
		t.Fatal(err)
	}
	if err := cli.Establish(ph.cliID); err != nil {
		t.Fatal(err)
	}
	e = xhEvent(t, srv, ph.srvID, kernel.EventEstablished, 10*time.Second)
	if e.QPNum != ph.iniN {
		t.Errorf("ESTABLISHED carries %#x, want the INI %#x", e.QPNum, ph.iniN)
	}
	return ph
}

// xhServer is a process with a domain, an SRQ and both listeners on port.
type xhServer struct {
	p      *hybrid.Process
	xrcd   kernel.XRCD
	srq    kernel.SRQ
	srqN   uint32
	lx, lu kernel.ID
	addr   netip.AddrPort
}

func xhNewServer(t *testing.T, ip netip.Addr, port uint16) *xhServer {
	t.Helper()
	s := &xhServer{p: xhProc(t, ip), addr: netip.AddrPortFrom(ip, port)}
	var err error
	if !s.p.XRC() {
		t.Fatal("the hybrid's model node has no XRC")
	}
	if s.xrcd, err = s.p.OpenXRCD("", kernel.XRCDCreate); err != nil {
		t.Fatal(err)
	}
	if s.srq, s.srqN, err = s.p.CreateSRQ(s.xrcd, 1<<16); err != nil {
		t.Fatal(err)
	}
	s.lx = xhListen(t, s.p, s.addr, kernel.ExchangeXRC)
	s.lu = xhListen(t, s.p, s.addr, kernel.ExchangeSIDR)
	return s
}

// TestXRCHybridPhysical: the XRC-typed physical exchange on the real CM
// (REQ, REP with CONNECT_RESPONSE, RTU by Establish) with model QP numbers;
// the model QPs get the path the real CM reported and carry data; DREQ/DREP
// and TIMEWAIT_EXIT.
func TestXRCHybridPhysical(t *testing.T) {
	ip := xhEnv(t)
	srv := xhNewServer(t, ip, 20301)
	cli := xhProc(t, ip)
	ph := xhConnectPhys(t, cli, srv.p, srv.lx, srv.xrcd, srv.addr)

	info, err := cli.QueryQP(ph.ini)
	if err != nil || info.State != verbs.QPStateRTS || info.DestQPN != ph.tgtN || info.Remote != ip || info.Num != ph.iniN {
		t.Errorf("INI %+v, %v; want RTS to %#x at %s", info, err, ph.tgtN, ip)
	}
	info, err = srv.p.QueryQP(ph.tgt)
	if err != nil || info.State != verbs.QPStateRTS || info.DestQPN != ph.iniN || info.Remote != ip || info.Num != ph.tgtN {
		t.Errorf("TGT %+v, %v; want RTS to %#x at %s", info, err, ph.iniN, ip)
	}
	ctx := rdmacmCtx(t, 10*time.Second)
	if err := cli.PostSend(ph.ini, []kernel.SendWR{{WRID: 7, RemoteSRQN: srv.srqN, Imm: 0xabc, Payload: []byte("over the model")}}); err != nil {
		t.Fatal(err)
	}
	var sc [4]kernel.SendCompletion
	if n, err := cli.PollSend(ctx, ph.ini, sc[:]); n != 1 || err != nil || sc[0].Status != verbs.WCSuccess || sc[0].QPNum != ph.iniN {
		t.Errorf("PollSend = %d, %v, %+v", n, err, sc[0])
	}
	var rc [4]kernel.RecvCompletion
	if n, err := srv.p.PollRecv(ctx, srv.srq, rc[:]); n != 1 || err != nil || rc[0].TGTQPN != ph.tgtN || rc[0].Imm != 0xabc || string(rc[0].Payload) != "over the model" {
		t.Errorf("PollRecv = %d, %v, %+v", n, err, rc[0])
	}

	// The INI side's DREQ: DISCONNECTED at the TGT side, whose DREP ends it.
	if err := cli.Disconnect(ph.cliID); err != nil {
		t.Fatal(err)
	}
	xhEvent(t, srv.p, ph.srvID, kernel.EventDisconnected, 10*time.Second)
	if err := srv.p.Disconnect(ph.srvID); err != nil {
		t.Fatal(err)
	}
	xhEvent(t, cli, ph.cliID, kernel.EventDisconnected, 10*time.Second)
	xhEvent(t, cli, ph.cliID, kernel.EventTimewaitExit, 10*time.Second)
	xhEvent(t, srv.p, ph.srvID, kernel.EventTimewaitExit, 10*time.Second)
	for _, h := range []kernel.ID{ph.cliID} {
		if err := cli.DestroyID(h); err != nil {
			t.Error(err)
		}
	}
	if err := srv.p.DestroyID(ph.srvID); err != nil {
		t.Error(err)
	}
	if err := cli.DestroyID(ph.cliID); err == nil {
		t.Error("DestroyID of a dead handle succeeded")
	}
}

// TestXRCHybridSIDRBesideXRC: the XRC and the SIDR listener share a port, and
// each exchange reaches its own.
func TestXRCHybridSIDRBesideXRC(t *testing.T) {
	ip := xhEnv(t)
	srv := xhNewServer(t, ip, 20302)
	cli := xhProc(t, ip)
	ctx := rdmacmCtx(t, 10*time.Second)

	req := xhMsg("VIRT_REQ", 0x6f0abc, 1)
	id, err := cli.Connect(ctx, srv.addr, kernel.ExchangeSIDR, 0, req)
	if err != nil {
		t.Fatal(err)
	}
	e := xhEvent(t, srv.p, srv.lu, kernel.EventConnectRequest, 10*time.Second)
	if e.Exchange != kernel.ExchangeSIDR || e.QPNum != 0 || e.Remote.Addr() != ip {
		t.Errorf("SIDR CONNECT_REQUEST: %v qpn %#x from %v", e.Exchange, e.QPNum, e.Remote)
	}
	xhCheckPD(t, "SIDR REQ", e.PrivateData, req, rdmacm.MaxSIDRReqPrivateData)
	rep := xhMsg("VIRT_ACCEPT", srv.srqN)
	if err := srv.p.Accept(e.ID, 0x6f0def, rep); err != nil {
		t.Fatal(err)
	}
	e2 := xhEvent(t, cli, id, kernel.EventEstablished, 10*time.Second)
	if e2.QPNum != 0x6f0def || e2.QKey != kernel.SIDRQKey || e2.Exchange != kernel.ExchangeSIDR {
		t.Errorf("SIDR ESTABLISHED: qpn %#x qkey %#x %v", e2.QPNum, e2.QKey, e2.Exchange)
	}
	xhCheckPD(t, "SIDR REP", e2.PrivateData, rep, rdmacm.MaxSIDRRepPrivateData)
	cli.DestroyID(id)
	srv.p.DestroyID(e.ID)
	xhNoEvent(t, srv.p, srv.lx, 200*time.Millisecond, "XRC listener after a SIDR request")

	// And the XRC request to the same port reaches the XRC listener only.
	ph := xhConnectPhys(t, cli, srv.p, srv.lx, srv.xrcd, srv.addr)
	xhNoEvent(t, srv.p, srv.lu, 200*time.Millisecond, "SIDR listener after an XRC request")
	cli.DestroyID(ph.cliID) // the INI side's destroy sends a DREQ
	xhEvent(t, srv.p, ph.srvID, kernel.EventDisconnected, 10*time.Second)
	srv.p.DestroyID(ph.srvID)
}

// TestXRCHybridSIDRSpare: after a SIDR exchange, kcm resolves the next id to
// the same destination in the background; the next exchange starts from it
// (no resolve on its path) and still completes, and Close destroys a spare
// nobody took.
func TestXRCHybridSIDRSpare(t *testing.T) {
	ip := xhEnv(t)
	srv := xhNewServer(t, ip, 20311)
	cli := xhProc(t, ip)
	before := rdmacm.Counts()
	waitSpare := func() {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for ready, _ := cli.Spares(); ready != 1; ready, _ = cli.Spares() {
			if time.Now().After(deadline) {
				t.Fatalf("no spare SIDR id to %v after 10 s", srv.addr)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	for i := range 3 {
		if i > 0 {
			waitSpare()
		}
		ctx := rdmacmCtx(t, 10*time.Second)
		id, err := cli.Connect(ctx, srv.addr, kernel.ExchangeSIDR, 0, xhMsg("VIRT_REQ", 0x6f0abc, uint32(i)))
		if err != nil {
			t.Fatalf("exchange %d: %v", i, err)
		}
		e := xhEvent(t, srv.p, srv.lu, kernel.EventConnectRequest, 10*time.Second)
		if err := srv.p.Accept(e.ID, 0x6f0def, xhMsg("VIRT_ACCEPT", srv.srqN)); err != nil {
			t.Fatal(err)
		}
		if e2 := xhEvent(t, cli, id, kernel.EventEstablished, 10*time.Second); e2.QPNum != 0x6f0def {
			t.Errorf("exchange %d: ESTABLISHED names qpn %#x", i, e2.QPNum)
		}
		cli.DestroyID(id)
		srv.p.DestroyID(e.ID)
	}
	if _, used := cli.Spares(); used != 2 {
		t.Errorf("%d of 3 exchanges started from a spare, want 2 (all but the first)", used)
	}
	waitSpare()
	if got := rdmacm.Counts().IDs - before.IDs; got != 1 {
		t.Errorf("the client holds %d more CM ids than before its exchanges, want 1 (the spare)", got)
	}
	if err := cli.Close(); err != nil {
		t.Fatal(err)
	}
	if got := rdmacm.Counts().IDs - before.IDs; got != 0 {
		t.Errorf("after Close the client holds %d more CM ids than before, want 0", got)
	}
}

// TestXRCHybridRejects: the reject paths, with the statuses the model gives.
func TestXRCHybridRejects(t *testing.T) {
	ip := xhEnv(t)
	srv := xhNewServer(t, ip, 20303)
	cli := xhProc(t, ip)
	ctx := rdmacmCtx(t, 20*time.Second)

	t.Run("XRCRejectWithData", func(t *testing.T) {
		_, iniN, err := cli.CreateINI()
		if err != nil {
			t.Fatal(err)
		}
		id, err := cli.Connect(ctx, srv.addr, kernel.ExchangeXRC, iniN, xhMsg("PHYS_REQ", iniN))
		if err != nil {
			t.Fatal(err)
		}
		defer cli.DestroyID(id)
		e := xhEvent(t, srv.p, srv.lx, kernel.EventConnectRequest, 10*time.Second)
		rej := bytes.Repeat([]byte{0x5a}, rdmacm.MaxRejPrivateData)
		if err := srv.p.Reject(e.ID, append(rej, 1)); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("Reject with %d bytes: %v, want EINVAL", len(rej)+1, err)
		}
		rej = xhMsg("REJECT", 0xbad)
		if err := srv.p.Reject(e.ID, rej); err != nil {
			t.Fatal(err)
		}
		defer srv.p.DestroyID(e.ID)
		r := xhEvent(t, cli, id, kernel.EventRejected, 10*time.Second)
		if r.Status != kernel.RejConsumerDefined {
			t.Errorf("REJECTED status %d, want %d", r.Status, kernel.RejConsumerDefined)
		}
		xhCheckPD(t, "REJ", r.PrivateData, rej, rdmacm.MaxRejPrivateData)
	})
	t.Run("SIDRReject", func(t *testing.T) {
		id, err := cli.Connect(ctx, srv.addr, kernel.ExchangeSIDR, 0, xhMsg("VIRT_REQ"))
		if err != nil {
			t.Fatal(err)
		}
		defer cli.DestroyID(id)
		e := xhEvent(t, srv.p, srv.lu, kernel.EventConnectRequest, 10*time.Second)
		rej := xhMsg("VIRT_REJECT", 7)
		if err := srv.p.Reject(e.ID, rej); err != nil {
			t.Fatal(err)
		}
		defer srv.p.DestroyID(e.ID)
		r := xhEvent(t, cli, id, kernel.EventUnreachable, 10*time.Second)
		if r.Status != kernel.SIDRRejected {
			t.Errorf("UNREACHABLE status %d, want %d", r.Status, kernel.SIDRRejected)
		}
		xhCheckPD(t, "SIDR REJ", r.PrivateData, rej, rdmacm.MaxSIDRRepPrivateData)
	})
	t.Run("AcceptTooLong", func(t *testing.T) {
		// A failed accept rejects the peer, as in the model.
		id, err := cli.Connect(ctx, srv.addr, kernel.ExchangeSIDR, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer cli.DestroyID(id)
		e := xhEvent(t, srv.p, srv.lu, kernel.EventConnectRequest, 10*time.Second)
		defer srv.p.DestroyID(e.ID)
		if err := srv.p.Accept(e.ID, 1, make([]byte, rdmacm.MaxSIDRRepPrivateData+1)); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("Accept with %d bytes: %v, want EINVAL", rdmacm.MaxSIDRRepPrivateData+1, err)
		}
		r := xhEvent(t, cli, id, kernel.EventUnreachable, 10*time.Second)
		if r.Status != kernel.SIDRRejected {
			t.Errorf("UNREACHABLE status %d, want %d", r.Status, kernel.SIDRRejected)
		}
	})
	t.Run("TypeMismatch", func(t *testing.T) {
		// An RC-typed REQ on RDMA_PS_IB to the XRC listener: REJECTED 28,
		// and the listener sees nothing.
		id, err := cli.Connect(ctx, srv.addr, kernel.ExchangeIBRC, 0x6f0f01, xhMsg("RC"))
		if err != nil {
			t.Fatal(err)
		}
		defer cli.DestroyID(id)
		r := xhEvent(t, cli, id, kernel.EventRejected, 10*time.Second)
		if r.Status != kernel.RejConsumerDefined {
			t.Errorf("REJECTED status %d, want %d", r.Status, kernel.RejConsumerDefined)
		}
		if len(r.PrivateData) != rdmacm.MaxRejPrivateData {
			t.Errorf("REJ private data %d bytes", len(r.PrivateData))
		}
		xhNoEvent(t, srv.p, srv.lx, 200*time.Millisecond, "XRC listener after an RC request")
	})
	t.Run("NoListener", func(t *testing.T) {
		// The model's answers: REJECTED 8 connected, UNREACHABLE 1 for SIDR.
		empty := netip.AddrPortFrom(ip, 20304)
		_, iniN, err := cli.CreateINI()
		if err != nil {
			t.Fatal(err)
		}
		id, err := cli.Connect(ctx, empty, kernel.ExchangeXRC, iniN, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer cli.DestroyID(id)
		e, err := cli.Event(ctx, id)
		if err != nil || e.Type != kernel.EventRejected || e.Status != kernel.RejInvalidServiceID {
			t.Errorf("XRC REQ to no listener: %v status %d, %v; the model says REJECTED %d", e.Type, e.Status, err, kernel.RejInvalidServiceID)
		}
		u, err := cli.Connect(ctx, empty, kernel.ExchangeSIDR, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer cli.DestroyID(u)
		e, err = cli.Event(ctx, u)
		if err != nil || e.Type != kernel.EventUnreachable || e.Status != kernel.SIDRNoListener {
			t.Errorf("SIDR REQ to no listener: %v status %d, %v; the model says UNREACHABLE %d", e.Type, e.Status, err, kernel.SIDRNoListener)
		}
	})
	t.Run("ConnectTooLong", func(t *testing.T) {
		if _, err := cli.Connect(ctx, srv.addr, kernel.ExchangeXRC, 0x6f0f02, make([]byte, rdmacm.MaxReqPrivateData+1)); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("XRC Connect with %d bytes: %v, want EINVAL", rdmacm.MaxReqPrivateData+1, err)
		}
		if _, err := cli.Connect(ctx, srv.addr, kernel.ExchangeSIDR, 0, make([]byte, rdmacm.MaxSIDRReqPrivateData+1)); !errors.Is(err, syscall.EINVAL) {
			t.Errorf("SIDR Connect with %d bytes: %v, want EINVAL", rdmacm.MaxSIDRReqPrivateData+1, err)
		}
	})
}

// TestXRCHybridManyVirtualOneUplink is why the engine's virtual links are
// SIDR: with one physical XRC-typed connection ESTABLISHED, many logical
// connections announced from the same INI QPN never meet the stale-connection
// table. As a control, a second connected-mode REQ reusing the live INI QPN
// is rejected with status 10.
func TestXRCHybridManyVirtualOneUplink(t *testing.T) {
	ip := xhEnv(t)
	srv := xhNewServer(t, ip, 20305)
	cli := xhProc(t, ip)
	ctx := rdmacmCtx(t, 60*time.Second)
	ph := xhConnectPhys(t, cli, srv.p, srv.lx, srv.xrcd, srv.addr)

	const n = 100
	ok, stale := 0, 0
	start := time.Now()
	for i := range n {
		req := xhMsg("VIRT_REQ", ph.iniN, uint32(i))
		id, err := cli.Connect(ctx, srv.addr, kernel.ExchangeSIDR, ph.iniN, req)
		if err != nil {
			t.Fatalf("virtual %d: %v", i, err)
		}
		e := xhEvent(t, srv.p, srv.lu, kernel.EventConnectRequest, 10*time.Second)
		if !bytes.Equal(e.PrivateData[:len(req)], req) {
			t.Fatalf("virtual %d: request %x", i, e.PrivateData[:len(req)])
		}
		if err := srv.p.Accept(e.ID, ph.tgtN, xhMsg("VIRT_ACCEPT", ph.tgtN, uint32(i))); err != nil {
			t.Fatal(err)
		}
		r, err := cli.Event(ctx, id)
		switch {
		case err != nil:
			t.Fatalf("virtual %d: %v", i, err)
		case r.Type == kernel.EventEstablished && r.QPNum == ph.tgtN:
			ok++
		case r.Type == kernel.EventRejected && r.Status == kernel.RejStaleConn:
			stale++
		default:
			t.Errorf("virtual %d: %v status %d qpn %#x", i, r.Type, r.Status, r.QPNum)
		}
		cli.DestroyID(id)
		srv.p.DestroyID(e.ID)
	}
	t.Logf("%d virtual exchanges over INI %#x in %v: %d accepted, %d stale rejects", n, ph.iniN, time.Since(start), ok, stale)
	if ok != n || stale != 0 {
		t.Errorf("%d of %d accepted, %d stale rejects; want all, none", ok, n, stale)
	}
	// The physical link saw nothing of it.
	xhNoEvent(t, cli, ph.cliID, 300*time.Millisecond, "physical INI id")
	xhNoEvent(t, srv.p, ph.srvID, 300*time.Millisecond, "physical TGT id")
	if err := cli.PostSend(ph.ini, []kernel.SendWR{{WRID: 1, RemoteSRQN: srv.srqN, Payload: []byte("still up")}}); err != nil {
		t.Fatal(err)
	}
	var rc [1]kernel.RecvCompletion
	if n, err := srv.p.PollRecv(ctx, srv.srq, rc[:]); n != 1 || err != nil || string(rc[0].Payload) != "still up" {
		t.Errorf("PollRecv = %d, %v, %+v", n, err, rc[0])
	}

	// Control: a second connected-mode REQ from the live INI QPN is stale.
	id, err := cli.Connect(ctx, srv.addr, kernel.ExchangeXRC, ph.iniN, xhMsg("PHYS_REQ", ph.iniN))
	if err != nil {
		t.Fatal(err)
	}
	defer cli.DestroyID(id)
	r := xhEvent(t, cli, id, kernel.EventRejected, 10*time.Second)
	if r.Status != kernel.RejStaleConn {
		t.Errorf("second REQ from INI %#x: REJECTED %d, want %d", ph.iniN, r.Status, kernel.RejStaleConn)
	}
	xhNoEvent(t, srv.p, srv.lx, 200*time.Millisecond, "XRC listener after the stale REQ")
	// The kernel also sends the old connection a DREQ (facts.md).
	e, err := cli.Event(rdmacmCtx(t, 5*time.Second), ph.cliID)
	t.Logf("old connection, INI side, after the stale REQ: %v status %d (%v)", e.Type, e.Status, err)
	if err != nil || e.Type != kernel.EventDisconnected {
		t.Errorf("old INI id: %v, %v; want DISCONNECTED (the kernel's DREQ)", e.Type, err)
	}
	cli.DestroyID(ph.cliID)
	srv.p.DestroyID(ph.srvID)
}

// openReal opens the real seam on the VM's device (closed when the test
// ends) and returns CheckXRC's verdict: nil where the device has XRC, an
// error matching real.ErrNoXRC where it genuinely has none. A device that
// claims XRC but cannot open a domain fails the test.
func openReal(t *testing.T) (*real.Process, error) {
	t.Helper()
	dev, ip := rdmacmEnv(t)
	p, err := real.Open(dev, ip, real.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	err = p.CheckXRC()
	if err != nil && !errors.Is(err, real.ErrNoXRC) {
		t.Fatal(err)
	}
	return p, err
}

// xrcReal opens the real seam on the VM's device, and skips (with the
// reason) where the device has no XRC: the XRC suite cannot run on rxe.
func xrcReal(t *testing.T) *real.Process {
	t.Helper()
	p, noXRC := openReal(t)
	if noXRC != nil {
		t.Skip(noXRC)
	}
	return p
}

// deviceNoXRC says why the VM's device has no XRC, or nil where it has.
func deviceNoXRC(t *testing.T) error {
	t.Helper()
	p, noXRC := openReal(t)
	p.Close()
	return noXRC
}

// TestXRCRealSkipsWithoutXRC: on rxe the real seam says XRC() false,
// OpenXRCD fails with ErrNotSupported, and the XRC suite skips saying so.
func TestXRCRealSkipsWithoutXRC(t *testing.T) {
	dev, ip := rdmacmEnv(t)
	p, err := real.Open(dev, ip, real.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	_, xerr := p.OpenXRCD("", kernel.XRCDCreate)
	t.Logf("%s: XRC() %v, OpenXRCD: %v", dev, p.XRC(), xerr)
	if p.XRC() && xerr != nil {
		t.Fatalf("device %s claims XRC (IBV_DEVICE_XRC) but OpenXRCD fails: %v", dev, xerr)
	}
	if !p.XRC() {
		if !errors.Is(xerr, verbs.ErrNotSupported) {
			t.Errorf("OpenXRCD on %s without XRC: %v, want ErrNotSupported", dev, xerr)
		}
		want := "device " + dev + " has no XRC (IBV_DEVICE_XRC clear; ibv_open_xrcd: operation not supported)"
		if err := p.CheckXRC(); err == nil || err.Error() != want || !errors.Is(err, real.ErrNoXRC) {
			t.Errorf("CheckXRC = %v, want %q", err, want)
		}
	}
	p.Close()
	xrcReal(t) // skips here on rxe, with the reason
	t.Logf("%s has XRC: the real XRC suite can run", dev)
}

// TestXRCRealCM: the CM half of the real seam is the hybrid's (one package,
// internal/kernel/kcm); on rxe it runs, with made-up QP numbers.
func TestXRCRealCM(t *testing.T) {
	dev, ip := rdmacmEnv(t)
	p, err := real.Open(dev, ip, real.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	addr := netip.AddrPortFrom(ip, 20306)
	lx := xhListen(t, p, addr, kernel.ExchangeXRC)
	lu := xhListen(t, p, addr, kernel.ExchangeSIDR)
	ctx := rdmacmCtx(t, 20*time.Second)
	id, err := p.Connect(ctx, addr, kernel.ExchangeSIDR, 0, xhMsg("VIRT_REQ"))
	if err != nil {
		t.Fatal(err)
	}
	e := xhEvent(t, p, lu, kernel.EventConnectRequest, 10*time.Second)
	if err := p.Accept(e.ID, 0x6f1001, xhMsg("VIRT_ACCEPT")); err != nil {
		t.Fatal(err)
	}
	if r := xhEvent(t, p, id, kernel.EventEstablished, 10*time.Second); r.QPNum != 0x6f1001 || r.QKey != kernel.SIDRQKey {
		t.Errorf("SIDR ESTABLISHED qpn %#x qkey %#x", r.QPNum, r.QKey)
	}
	const ini, tgt = 0x6f1002, 0x6f1003
	c, err := p.Connect(ctx, addr, kernel.ExchangeXRC, ini, xhMsg("PHYS_REQ"))
	if err != nil {
		t.Fatal(err)
	}
	e = xhEvent(t, p, lx, kernel.EventConnectRequest, 10*time.Second)
	if e.QPNum != ini {
		t.Errorf("XRC CONNECT_REQUEST qpn %#x", e.QPNum)
	}
	if err := p.Accept(e.ID, tgt, nil); err != nil {
		t.Fatal(err)
	}
	if r := xhEvent(t, p, c, kernel.EventConnectResponse, 10*time.Second); r.QPNum != tgt {
		t.Errorf("CONNECT_RESPONSE qpn %#x", r.QPNum)
	}
	if err := p.Establish(c); err != nil {
		t.Fatal(err)
	}
	xhEvent(t, p, e.ID, kernel.EventEstablished, 10*time.Second)
	p.DestroyID(c) // INI side: a DREQ
	xhEvent(t, p, e.ID, kernel.EventDisconnected, 10*time.Second)
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Listen(addr, kernel.ExchangeXRC); !errors.Is(err, verbs.ErrClosed) {
		t.Errorf("Listen after Close: %v", err)
	}
}

// TestXRCRealZZLeaks runs after the hybrid and real tests (and the
// processes' cleanups): no CM id, channel or verbs object is left.
func TestXRCRealZZLeaks(t *testing.T) {
	xhEnv(t)
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, v, n := rdmacm.Counts(), verbs.Counts(), rdmacmKernelIDs(t)
		if c == (rdmacm.Counters{}) && v == (verbs.ObjectCounts{}) && n == rdmacmBaseIDs {
			t.Logf("rdmacm %+v, verbs %+v, kernel cm_ids %d (at start %d)", c, v, n, rdmacmBaseIDs)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("leak: rdmacm %+v, verbs %+v, kernel cm_ids %d (at start %d)\n%s", c, v, n, rdmacmBaseIDs, objtrace.Report())
		}
		time.Sleep(100 * time.Millisecond)
	}
}
