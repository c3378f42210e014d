package xrc

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/internal/kernel/model"
	"github.com/goxrc/goxrc/verbs"
	"github.com/goxrc/goxrc/xrc/internal/wire"
)

var (
	addrA = netip.MustParseAddr("10.0.0.1")
	addrB = netip.MustParseAddr("10.0.0.2")
	addrC = netip.MustParseAddr("10.0.0.3") // a third node, for requests from the wrong one
)

const senderInc = 0xAAAA0001

// receiver is one acceptor process on node B.
type receiver struct {
	p      *model.Process
	d      kernel.XRCD
	srqn   uint32
	acc    *acceptor
	port   uint16
	lx, lu kernel.ID
}

type env struct {
	t      *testing.T
	f      *model.Fabric
	a, b   *model.Node
	dom    DomainFile
	sender *model.Process
	r1, r2 *receiver
	tag    uint32
}

func newEnv(t *testing.T) *env {
	f := model.NewFabric(model.ReuseLIFO)
	e := &env{t: t, f: f, a: f.AddNode(addrA, model.NodeConfig{}), b: f.AddNode(addrB, model.NodeConfig{})}
	var err error
	e.dom, err = OpenDomainFile(context.Background(), filepath.Join(t.TempDir(), "goxrc"))
	if err != nil {
		t.Fatal(err)
	}
	e.sender = e.a.NewProcess()
	e.r1, e.r2 = e.newReceiver(20001), e.newReceiver(20002)
	return e
}

func (e *env) newReceiver(port uint16) *receiver {
	t := e.t
	r := &receiver{p: e.b.NewProcess(), port: port}
	var err error
	if r.d, err = r.p.OpenXRCD(e.dom.Path, kernel.XRCDCreate); err != nil {
		t.Fatal(err)
	}
	if _, r.srqn, err = r.p.CreateSRQ(r.d, frameSize(MaxMessageSize)); err != nil {
		t.Fatal(err)
	}
	r.acc = newAcceptor(acceptorConfig{Kernel: r.p, XRCD: r.d, DomainID: e.dom.ID, Incarnation: uint64(port), SRQN: r.srqn, Credits: 8})
	ap := netip.AddrPortFrom(addrB, port)
	if r.lx, err = r.p.Listen(ap, kernel.ExchangeXRC); err != nil {
		t.Fatal(err)
	}
	if r.lu, err = r.p.Listen(ap, kernel.ExchangeSIDR); err != nil {
		t.Fatal(err)
	}
	return r
}

func ctx5(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func (e *env) ev(p *model.Process, id kernel.ID, want kernel.EventType) kernel.Event {
	e.t.Helper()
	ev, err := p.Event(ctx5(e.t), id)
	if err != nil || ev.Type != want {
		e.t.Fatalf("event %v %v, want %v", ev.Type, err, want)
	}
	return ev
}

func (e *env) nextReq(t wire.Type) wire.Req {
	e.tag++
	return wire.Req{Type: t, ConnTag: e.tag, Incarnation: senderInc, SRQN: 0x99, ReplyPort: 30000, Credits: 8, MaxMessage: MaxMessageSize}
}

// rawUplink is the sender's side of a physical link.
type rawUplink struct {
	ini      kernel.QP
	iniQPN   uint32
	aid, pid kernel.ID // the physical CM connection
	tgtQPN   uint32
	domain   uint64
}

// phys runs a PHYS_REQ from the sender to r through the real (model) CM and
// the acceptor, and returns the decision (and the rawUplink on accept).
func (e *env) phys(r *receiver, mut func(*wire.Req)) (decision, rawUplink) {
	t := e.t
	t.Helper()
	var u rawUplink
	var err error
	u.ini, u.iniQPN, err = e.sender.CreateINI()
	if err != nil {
		t.Fatal(err)
	}
	req := e.nextReq(wire.TypePhysReq)
	req.INIQPN = u.iniQPN
	if mut != nil {
		mut(&req)
	}
	buf := make([]byte, wire.BudgetREQ)
	n, err := req.Encode(buf)
	if err != nil {
		t.Fatal(err)
	}
	aid, err := e.sender.Connect(ctx5(t), netip.AddrPortFrom(addrB, r.port), kernel.ExchangeXRC, u.iniQPN, buf[:n])
	if err != nil {
		t.Fatal(err)
	}
	cr := e.ev(r.p, r.lx, kernel.EventConnectRequest)
	d := r.acc.Decide(cr)
	if !d.Accept {
		if err := r.p.Reject(cr.ID, d.PrivateData); err != nil {
			t.Fatal(err)
		}
		rej := e.ev(e.sender, aid, kernel.EventRejected)
		var got wire.Reject
		if err := wire.DecodeReject(rej.PrivateData, &got); err != nil || got != d.Reject {
			t.Fatalf("REJECT on the wire: %v %+v", err, got)
		}
		return d, u
	}
	if err := r.p.Accept(cr.ID, d.QPNum, d.PrivateData); err != nil {
		t.Fatal(err)
	}
	resp := e.ev(e.sender, aid, kernel.EventConnectResponse)
	var acc wire.Accept
	if err := wire.DecodeAccept(resp.PrivateData, &acc); err != nil {
		t.Fatal(err)
	}
	if acc.TGTQPN != resp.QPNum || acc.TagEcho != req.ConnTag || acc.DomainID != e.dom.ID {
		t.Fatalf("ACCEPT %+v vs CM qp_num %#x", acc, resp.QPNum)
	}
	if err := e.sender.TransitionQP(u.ini, verbs.QPStateRTS, aid); err != nil {
		t.Fatal(err)
	}
	if err := e.sender.Establish(aid); err != nil {
		t.Fatal(err)
	}
	e.ev(r.p, cr.ID, kernel.EventEstablished)
	u.tgtQPN, u.domain = acc.TGTQPN, acc.DomainID
	u.aid, u.pid = aid, cr.ID
	return d, u
}

// virt runs a VIRT_REQ over SIDR from the sender to r and returns the
// decision.
func (e *env) virt(r *receiver, req wire.Req) decision {
	e.t.Helper()
	return e.virtFrom(e.sender, r, req)
}

// virtFrom is virt from process from (the request comes from its node).
func (e *env) virtFrom(from *model.Process, r *receiver, req wire.Req) decision {
	t := e.t
	t.Helper()
	buf := make([]byte, wire.BudgetSIDRREQ)
	n, err := req.Encode(buf)
	if err != nil {
		t.Fatal(err)
	}
	sid, err := from.Connect(ctx5(t), netip.AddrPortFrom(addrB, r.port), kernel.ExchangeSIDR, 0, buf[:n])
	if err != nil {
		t.Fatal(err)
	}
	cr := e.ev(r.p, r.lu, kernel.EventConnectRequest)
	d := r.acc.Decide(cr)
	if d.Accept {
		if err := r.p.Accept(cr.ID, d.QPNum, d.PrivateData); err != nil {
			t.Fatal(err)
		}
		rep := e.ev(from, sid, kernel.EventEstablished)
		var acc wire.Accept
		if err := wire.DecodeAccept(rep.PrivateData, &acc); err != nil || acc.TGTQPN != rep.QPNum {
			t.Fatalf("ACCEPT over SIDR: %v %+v", err, acc)
		}
	} else {
		if err := r.p.Reject(cr.ID, d.PrivateData); err != nil {
			t.Fatal(err)
		}
		un := e.ev(from, sid, kernel.EventUnreachable)
		var got wire.Reject
		if err := wire.DecodeReject(un.PrivateData, &got); err != nil || got != d.Reject {
			t.Fatalf("REJECT over SIDR: %v %+v", err, got)
		}
	}
	from.DestroyID(sid)
	r.p.DestroyID(cr.ID)
	return d
}

func (e *env) virtReq(u rawUplink) wire.Req {
	req := e.nextReq(wire.TypeVirtReq)
	req.INIQPN, req.TGTQPNHint, req.DomainHint = u.iniQPN, u.tgtQPN, u.domain
	return req
}

// expect checks the kernel's handle count on a TGT and both local counts.
func (e *env) expect(qpn uint32, kernelHandles, local1, local2 int) {
	e.t.Helper()
	if got := e.b.TGTHandles(qpn); got != kernelHandles {
		e.t.Errorf("TGT %#x: %d kernel handles, want %d", qpn, got, kernelHandles)
	}
	if got := e.r1.acc.LocalCount(qpn); got != local1 {
		e.t.Errorf("TGT %#x: r1 local count %d, want %d", qpn, got, local1)
	}
	if got := e.r2.acc.LocalCount(qpn); got != local2 {
		e.t.Errorf("TGT %#x: r2 local count %d, want %d", qpn, got, local2)
	}
}

// renumberingQuery reports, while num is set, that number for any XRC
// receive QP it is asked about: as if the handle OpenTGT gave were on a QP
// other than the one named.
type renumberingQuery struct {
	wrapper
	num atomic.Uint32
}

func (k *renumberingQuery) QueryQP(q kernel.QP) (kernel.QPInfo, error) {
	i, err := k.Kernel.QueryQP(q)
	if n := k.num.Load(); err == nil && n != 0 && i.Type == verbs.QPTypeXRCRecv {
		i.Num = n
	}
	return i, err
}

func wantReject(t *testing.T, d decision, reason wire.RejectReason) {
	t.Helper()
	if d.Accept || d.Reject.Reason != reason {
		t.Fatalf("decision accept=%v reason %v, want REJECT(%v)", d.Accept, d.Reject.Reason, reason)
	}
}

func wantAccept(t *testing.T, d decision) {
	t.Helper()
	if !d.Accept {
		t.Fatalf("rejected: %v", d.Reject.Reason)
	}
}

// One row per line of the decision table in xrc-protocol.md.
func TestAcceptorDecisionTable(t *testing.T) {
	rows := []struct {
		name string
		run  func(t *testing.T, e *env)
	}{
		{"PHYS_REQ hint 0: create, count 1, creator", func(t *testing.T, e *env) {
			d, u := e.phys(e.r1, nil)
			wantAccept(t, d)
			if !d.Leg.Downlink.Creator || !d.Leg.Physical {
				t.Fatal("not recorded as creator")
			}
			e.expect(u.tgtQPN, 1, 1, 0)
			if ini, tgt := e.b.QPCount(); ini != 0 || tgt != 1 {
				t.Fatalf("B QPs %d/%d", ini, tgt)
			}
		}},
		{"PHYS_REQ REPLACES_TGT: new TGT, old left to its users", func(t *testing.T, e *env) {
			_, u1 := e.phys(e.r1, nil)
			d, u2 := e.phys(e.r1, func(r *wire.Req) { r.Flags |= wire.FlagReplacesTGT; r.TGTQPNHint = u1.tgtQPN })
			wantAccept(t, d)
			if u2.tgtQPN == u1.tgtQPN {
				t.Fatal("no new TGT")
			}
			e.expect(u1.tgtQPN, 1, 1, 0)
			e.expect(u2.tgtQPN, 1, 1, 0)
		}},
		{"VIRT_REQ foreign domain hint: DOMAIN_MISMATCH with our id", func(t *testing.T, e *env) {
			_, u := e.phys(e.r1, nil)
			req := e.virtReq(u)
			req.DomainHint = e.dom.ID + 1
			before := e.r2.p.Handles()
			d := e.virt(e.r2, req)
			wantReject(t, d, wire.RejectDomainMismatch)
			if d.Reject.DomainID != e.dom.ID {
				t.Fatalf("domain id %#x, want %#x", d.Reject.DomainID, e.dom.ID)
			}
			e.expect(u.tgtQPN, 1, 1, 0)
			if e.r2.p.Handles() != before {
				t.Fatal("handle leaked")
			}
		}},
		{"VIRT_REQ held handle, same incarnation and INI: count+1, no kernel call", func(t *testing.T, e *env) {
			_, u := e.phys(e.r1, nil)
			wantAccept(t, e.virt(e.r1, e.virtReq(u)))
			e.expect(u.tgtQPN, 1, 2, 0)
		}},
		{"VIRT_REQ held handle, other INI: TGT_GONE, no change", func(t *testing.T, e *env) {
			_, u := e.phys(e.r1, nil)
			req := e.virtReq(u)
			req.INIQPN++
			wantReject(t, e.virt(e.r1, req), wire.RejectTGTGone)
			e.expect(u.tgtQPN, 1, 1, 0)
		}},
		{"VIRT_REQ no local handle: register and verify, count 1", func(t *testing.T, e *env) {
			_, u := e.phys(e.r1, nil)
			d := e.virt(e.r2, e.virtReq(u))
			wantAccept(t, d)
			if d.Leg.Downlink.Creator {
				t.Fatal("opener recorded as creator")
			}
			e.expect(u.tgtQPN, 2, 1, 1)
			if _, tgt := e.b.QPCount(); tgt != 1 {
				t.Fatal("a second TGT was made")
			}
		}},
		{"VIRT_REQ no local handle, verify fails (dest QPN): destroy handle, TGT_GONE", func(t *testing.T, e *env) {
			_, u := e.phys(e.r1, nil)
			req := e.virtReq(u)
			req.INIQPN = u.iniQPN + 7
			before := e.r2.p.Handles()
			wantReject(t, e.virt(e.r2, req), wire.RejectTGTGone)
			e.expect(u.tgtQPN, 1, 1, 0)
			if e.r2.p.Handles() != before || e.r2.acc.Downlinks() != 0 {
				t.Fatal("handle leaked")
			}
		}},
		{"VIRT_REQ no local handle, TGT number gone: TGT_GONE", func(t *testing.T, e *env) {
			_, u := e.phys(e.r1, nil)
			req := e.virtReq(u)
			req.TGTQPNHint = 0x7FFF
			wantReject(t, e.virt(e.r2, req), wire.RejectTGTGone)
			e.expect(u.tgtQPN, 1, 1, 0)
		}},
		{"PHYS_REQ again after our REP hit a stale entry: the first answer goes, the REQ is decided anew", func(t *testing.T, e *env) {
			d1, u1 := e.phys(e.r1, nil)
			// The TGT dies with its CM connection still up: the sender's
			// node keeps (node B, its number) in its stale table.
			if err := e.r1.acc.Release(d1.Leg); err != nil {
				t.Fatal(err)
			}
			_, iniQPN, err := e.sender.CreateINI()
			if err != nil {
				t.Fatal(err)
			}
			req := e.nextReq(wire.TypePhysReq)
			req.INIQPN = iniQPN
			buf := make([]byte, wire.BudgetREQ)
			n, err := req.Encode(buf)
			if err != nil {
				t.Fatal(err)
			}
			aid, err := e.sender.Connect(ctx5(t), netip.AddrPortFrom(addrB, e.r1.port), kernel.ExchangeXRC, iniQPN, buf[:n])
			if err != nil {
				t.Fatal(err)
			}
			cr := e.ev(e.r1.p, e.r1.lx, kernel.EventConnectRequest)
			d := e.r1.acc.Decide(cr)
			wantAccept(t, d)
			if d.QPNum != u1.tgtQPN { // the env's fabric reuses numbers last in, first out
				t.Fatalf("new TGT %#x, want the freed number %#x again", d.QPNum, u1.tgtQPN)
			}
			if err := e.r1.p.Accept(cr.ID, d.QPNum, d.PrivateData); err != nil {
				t.Fatal(err)
			}
			if ev := e.ev(e.r1.p, cr.ID, kernel.EventRejected); ev.Status != kernel.RejStaleConn {
				t.Fatalf("REJECTED status %d, want %d", ev.Status, kernel.RejStaleConn)
			}
			// The sender's CM sent the old connection a DREQ; its entry
			// leaves the stale table with our DREP (the engine's watcher
			// answers DISCONNECTED so).
			e.ev(e.r1.p, u1.pid, kernel.EventDisconnected)
			if err := e.r1.p.Disconnect(u1.pid); err != nil {
				t.Fatal(err)
			}
			cr2 := e.ev(e.r1.p, e.r1.lx, kernel.EventConnectRequest) // the CM sends the REQ again
			d2 := e.r1.acc.Decide(cr2)
			wantAccept(t, d2)
			if d2.Replaced != d.Leg || d2.Leg == d.Leg {
				t.Fatalf("Replaced %p, want the first answer's leg %p", d2.Replaced, d.Leg)
			}
			if err := e.r1.p.Accept(cr2.ID, d2.QPNum, d2.PrivateData); err != nil {
				t.Fatal(err)
			}
			if resp := e.ev(e.sender, aid, kernel.EventConnectResponse); resp.QPNum != d2.QPNum {
				t.Fatalf("CONNECT_RESPONSE names TGT %#x, want %#x", resp.QPNum, d2.QPNum)
			}
			e.expect(d2.QPNum, 1, 1, 0)
			if e.r1.acc.Downlinks() != 1 || e.r1.acc.LocalCounts() != 1 {
				t.Fatalf("r1: %d downlinks, %d counts; want the new answer's only", e.r1.acc.Downlinks(), e.r1.acc.LocalCounts())
			}
			// A PHYS_REQ for a held leg from another INI is no
			// retransmission.
			wantReject(t, e.r1.acc.Decide(kernel.Event{Type: kernel.EventConnectRequest, Exchange: kernel.ExchangeXRC,
				Remote: cr2.Remote, QPNum: iniQPN + 1, PrivateData: func() []byte {
					r := req
					r.INIQPN = iniQPN + 1
					b := make([]byte, wire.BudgetREQ)
					n, _ := r.Encode(b)
					return b[:n]
				}()}), wire.RejectBadRequest)
		}},
		{"VIRT_REQ to a reused TGT number (another sender's TGT): TGT_GONE", func(t *testing.T, e *env) {
			d1, u1 := e.phys(e.r1, nil)
			// The pair goes: CM connection first (else the reused number
			// hits the INI side's stale entry at REP time), then the TGT.
			e.sender.Disconnect(u1.aid)
			e.ev(e.r1.p, u1.pid, kernel.EventDisconnected)
			e.r1.p.Disconnect(u1.pid)
			if err := e.r1.acc.Release(d1.Leg); err != nil { // the TGT dies...
				t.Fatal(err)
			}
			_, u2 := e.phys(e.r1, nil) // ...and its number comes back for a new pair
			if u2.tgtQPN != u1.tgtQPN {
				t.Fatalf("setup: TGT number %#x not reused (%#x), though the model reuses LIFO", u1.tgtQPN, u2.tgtQPN)
			}
			before := e.r2.p.Handles()
			wantReject(t, e.virt(e.r2, e.virtReq(u1)), wire.RejectTGTGone) // stale hint, old INI
			e.expect(u2.tgtQPN, 1, 1, 0)
			if e.r2.p.Handles() != before {
				t.Fatal("handle leaked")
			}
		}},
		{"VIRT_REQ held handle, request from another node: TGT_GONE, no change", func(t *testing.T, e *env) {
			// The hint, INI and incarnation are those of the sender's TGT,
			// which r1 holds; only the requester's node differs.
			_, u := e.phys(e.r1, nil)
			other := e.f.AddNode(addrC, model.NodeConfig{}).NewProcess()
			wantReject(t, e.virtFrom(other, e.r1, e.virtReq(u)), wire.RejectTGTGone)
			e.expect(u.tgtQPN, 1, 1, 0)
			if e.r1.acc.LocalCounts() != 1 {
				t.Fatalf("r1 counts %d legs, want 1", e.r1.acc.LocalCounts())
			}
		}},
		{"VIRT_REQ no local handle, verify fails (the TGT's peer is another node): destroy handle, TGT_GONE", func(t *testing.T, e *env) {
			_, u := e.phys(e.r1, nil)
			other := e.f.AddNode(addrC, model.NodeConfig{}).NewProcess()
			before := e.r2.p.Handles()
			wantReject(t, e.virtFrom(other, e.r2, e.virtReq(u)), wire.RejectTGTGone)
			e.expect(u.tgtQPN, 1, 1, 0)
			if e.r2.p.Handles() != before || e.r2.acc.Downlinks() != 0 || e.r2.acc.LocalCounts() != 0 {
				t.Fatal("handle or count leaked")
			}
		}},
		{"VIRT_REQ no local handle, verify fails (TGT not in RTR/RTS): destroy handle, TGT_GONE", func(t *testing.T, e *env) {
			// A TGT in ERR keeps its destination and address (the
			// model, as ibv_query_qp): only its state tells it is no
			// live link. (A TGT in INIT or RESET has neither: those fail
			// the destination check too.)
			d, u := e.phys(e.r1, nil)
			if err := e.r1.p.TransitionQP(d.Leg.Downlink.qp, verbs.QPStateErr, 0); err != nil {
				t.Fatal(err)
			}
			before := e.r2.p.Handles()
			wantReject(t, e.virt(e.r2, e.virtReq(u)), wire.RejectTGTGone)
			e.expect(u.tgtQPN, 1, 1, 0)
			if e.r2.p.Handles() != before || e.r2.acc.Downlinks() != 0 || e.r2.acc.LocalCounts() != 0 {
				t.Fatal("handle or count leaked")
			}
		}},
		{"VIRT_REQ no local handle, verify fails (the opened TGT reports another number): destroy handle, TGT_GONE", func(t *testing.T, e *env) {
			// Everything else verifies (the sender's TGT, RTR/RTS, its
			// INI, its node); only the number the opened handle reports
			// differs from the hint, as ReverseLeg checks. Here it is
			// the number of a TGT r2 already holds (made for another
			// PHYS_REQ): taken, the new downlink went into r2's map
			// under that number, over the one there, and the ACCEPT named
			// a TGT the sender never asked for (its virtLink refuses
			// such an ACCEPT), leaving r2 a leg and a handle nobody uses.
			k := &renumberingQuery{wrapper: wrapper{e.r2.p}}
			e.r2.acc.cfg.Kernel = k
			_, u := e.phys(e.r1, nil)
			_, held := e.phys(e.r2, nil)
			handles, legs, dls := e.r2.p.Handles(), e.r2.acc.LocalCounts(), e.r2.acc.Downlinks()
			k.num.Store(held.tgtQPN)
			wantReject(t, e.virt(e.r2, e.virtReq(u)), wire.RejectTGTGone)
			k.num.Store(0)
			e.expect(u.tgtQPN, 1, 1, 0)
			e.expect(held.tgtQPN, 1, 0, 1)
			if e.r2.p.Handles() != handles || e.r2.acc.LocalCounts() != legs || e.r2.acc.Downlinks() != dls {
				t.Fatalf("r2 after the refusal: %d handles, %d legs, %d downlinks; was %d, %d, %d",
					e.r2.p.Handles(), e.r2.acc.LocalCounts(), e.r2.acc.Downlinks(), handles, legs, dls)
			}
		}},
		{"VIRT_REQ for a known leg without MOVE: BAD_REQUEST, leg and counts unchanged", func(t *testing.T, e *env) {
			// The sender rebuilt its uplink and asks again for a leg r2
			// holds, naming the new TGT but not flagged MOVE: moving the
			// leg (or making a second one) is not what it asked for.
			_, u1 := e.phys(e.r1, nil)
			req := e.virtReq(u1)
			d1 := e.virt(e.r2, req)
			wantAccept(t, d1)
			_, u2 := e.phys(e.r1, func(r *wire.Req) { r.Flags |= wire.FlagReplacesTGT; r.TGTQPNHint = u1.tgtQPN })
			again := req
			again.INIQPN, again.TGTQPNHint = u2.iniQPN, u2.tgtQPN
			before := e.r2.p.Handles()
			wantReject(t, e.virt(e.r2, again), wire.RejectBadRequest)
			if tgt, ok := e.r2.acc.LegTGT(d1.Leg); !ok || tgt != u1.tgtQPN {
				t.Fatalf("the leg is on %#x (registered %v), want it left on %#x", tgt, ok, u1.tgtQPN)
			}
			e.expect(u1.tgtQPN, 2, 1, 1)
			e.expect(u2.tgtQPN, 1, 1, 0)
			if e.r2.p.Handles() != before || e.r2.acc.LocalCounts() != 1 {
				t.Fatalf("r2: %d handles (was %d), %d legs", e.r2.p.Handles(), before, e.r2.acc.LocalCounts())
			}
		}},
		{"duplicate VIRT_REQ: cached ACCEPT, no count change", func(t *testing.T, e *env) {
			_, u := e.phys(e.r1, nil)
			req := e.virtReq(u)
			d1 := e.virt(e.r2, req)
			d2 := e.virt(e.r2, req)
			wantAccept(t, d2)
			if !d2.Duplicate || string(d2.PrivateData) != string(d1.PrivateData) || d2.Leg != d1.Leg {
				t.Fatal("retransmission not answered from the cache")
			}
			e.expect(u.tgtQPN, 2, 1, 1)
		}},
		{"VIRT_REQ of a leg used and released (a late retransmission): BAD_REQUEST, no count", func(t *testing.T, e *env) {
			_, u := e.phys(e.r1, nil)
			req := e.virtReq(u)
			d := e.virt(e.r2, req)
			wantAccept(t, d)
			if !e.r2.acc.LegAccepts(d.Leg, u.tgtQPN) {
				t.Fatal("a message through the leg's TGT refused")
			}
			if err := e.r2.acc.Release(d.Leg); err != nil {
				t.Fatal(err)
			}
			e.expect(u.tgtQPN, 1, 1, 0)
			before := e.r2.p.Handles()
			wantReject(t, e.virt(e.r2, req), wire.RejectBadRequest)
			e.expect(u.tgtQPN, 1, 1, 0)
			if e.r2.p.Handles() != before || e.r2.acc.Downlinks() != 0 {
				t.Fatal("handle leaked")
			}
		}},
		{"VIRT_REQ of a leg released unused (the sender never had our ACCEPT): decided anew", func(t *testing.T, e *env) {
			_, u := e.phys(e.r1, nil)
			req := e.virtReq(u)
			d := e.virt(e.r2, req)
			wantAccept(t, d)
			if e.r2.acc.LegAccepts(d.Leg, u.tgtQPN+1) {
				t.Fatal("a message through another TGT accepted")
			}
			if err := e.r2.acc.Release(d.Leg); err != nil {
				t.Fatal(err)
			}
			d2 := e.virt(e.r2, req)
			wantAccept(t, d2)
			if d2.Duplicate || d2.Leg == d.Leg {
				t.Fatal("answered from a released leg")
			}
			e.expect(u.tgtQPN, 2, 1, 1)
		}},
		{"PHYS_REQ of a leg used and released: BAD_REQUEST, no TGT made", func(t *testing.T, e *env) {
			d, u := e.phys(e.r1, nil)
			if !e.r1.acc.LegAccepts(d.Leg, u.tgtQPN) {
				t.Fatal("a message through the leg's TGT refused")
			}
			if err := e.r1.acc.Release(d.Leg); err != nil {
				t.Fatal(err)
			}
			_, tgts := e.b.QPCount()
			d2, _ := e.phys(e.r1, func(r *wire.Req) { r.ConnTag = d.Leg.PeerTag })
			wantReject(t, d2, wire.RejectBadRequest)
			if _, n := e.b.QPCount(); n != tgts || e.r1.acc.Downlinks() != 0 {
				t.Fatalf("TGTs %d -> %d, downlinks %d", tgts, n, e.r1.acc.Downlinks())
			}
		}},
		{"version mismatch: REJECT(VERSION) with our range", func(t *testing.T, e *env) {
			cr := kernel.Event{Type: kernel.EventConnectRequest, Exchange: kernel.ExchangeSIDR,
				Remote: netip.AddrPortFrom(addrA, 1), PrivateData: []byte{0x58, 0x52, 9, 2, 0, 0, 0, 8}}
			d := e.r1.acc.Decide(cr)
			wantReject(t, d, wire.RejectVersion)
			if d.Reject.MinVersion != wire.MinVersion || d.Reject.MaxVersion != wire.MaxVersion {
				t.Fatalf("%+v", d.Reject)
			}
		}},
		{"malformed or misplaced request: BAD_REQUEST", func(t *testing.T, e *env) {
			_, u := e.phys(e.r1, nil)
			req := e.virtReq(u)
			b := make([]byte, wire.BudgetSIDRREQ)
			req.Encode(b)
			b[100] = 1 // garbage in the padding
			cr := kernel.Event{Type: kernel.EventConnectRequest, Exchange: kernel.ExchangeSIDR, Remote: netip.AddrPortFrom(addrA, 1), PrivateData: b}
			wantReject(t, e.r2.acc.Decide(cr), wire.RejectBadRequest)
			// A VIRT_REQ in a connected-mode REQ.
			cr.Exchange = kernel.ExchangeXRC
			wantReject(t, e.r2.acc.Decide(cr), wire.RejectBadRequest)
			// A PHYS_REQ whose INI QPN disagrees with the CM's, after a
			// control: the same request with the CM's INI QPN is accepted.
			if ctl, _ := e.phys(e.r1, nil); !ctl.Accept {
				t.Fatalf("control: a PHYS_REQ whose INI QPN agrees was refused: %+v", ctl.Reject)
			}
			d, _ := e.phys(e.r1, func(r *wire.Req) { r.INIQPN += 100 })
			wantReject(t, d, wire.RejectBadRequest)
			e.expect(u.tgtQPN, 1, 1, 0)
			if e.r2.p.Handles() != 4 { // XRCD, SRQ, two listeners
				t.Fatalf("r2 holds %d handles", e.r2.p.Handles())
			}
		}},
		{"application reject: APP_REJECT, nothing made or opened", func(t *testing.T, e *env) {
			_, u := e.phys(e.r1, nil)
			e.r2.acc.cfg.Admit = func(*wire.Req) ([]byte, *appReject) { return nil, &appReject{Detail: 403, App: []byte("no")} }
			before := e.r2.p.Handles()
			d := e.virt(e.r2, e.virtReq(u))
			wantReject(t, d, wire.RejectApp)
			if d.Reject.Detail != 403 || string(d.Reject.App()) != "no" || e.r2.p.Handles() != before {
				t.Fatalf("%+v", d.Reject)
			}
			e.r1.acc.cfg.Admit = e.r2.acc.cfg.Admit
			_, tgt0 := e.b.QPCount()
			d, _ = e.phys(e.r1, nil)
			wantReject(t, d, wire.RejectApp)
			if _, tgt := e.b.QPCount(); tgt != tgt0 {
				t.Fatal("TGT made for a rejected PHYS_REQ")
			}
		}},
		{"unregister: local count 0 destroys the handle, TGT dies with the last", func(t *testing.T, e *env) {
			d1, u := e.phys(e.r1, nil)
			d2 := e.virt(e.r1, e.virtReq(u))
			d3 := e.virt(e.r2, e.virtReq(u))
			e.expect(u.tgtQPN, 2, 2, 1)
			e.r1.acc.Release(d1.Leg) // creator's first leg
			e.expect(u.tgtQPN, 2, 1, 1)
			e.r1.acc.Release(d1.Leg) // twice is a no-op
			e.r1.acc.Release(d2.Leg) // creator lets go: TGT lives for r2
			e.expect(u.tgtQPN, 1, 0, 1)
			if c := send(t, e.sender, u.ini, e.r2.srqn); c != verbs.WCSuccess {
				t.Fatalf("send after creator left: %v", c)
			}
			e.r2.acc.Release(d3.Leg)
			e.expect(u.tgtQPN, 0, 0, 0)
			if _, tgt := e.b.QPCount(); tgt != 0 {
				t.Fatal("TGT outlived its last user")
			}
		}},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) { row.run(t, newEnv(t)) })
	}
}

func TestAcceptorNoXRC(t *testing.T) {
	f := model.NewFabric(model.ReuseLIFO)
	p := f.AddNode(addrB, model.NodeConfig{NoXRC: true}).NewProcess()
	acc := newAcceptor(acceptorConfig{Kernel: p, DomainID: 1})
	d := acc.Decide(kernel.Event{Type: kernel.EventConnectRequest, Exchange: kernel.ExchangeXRC})
	wantReject(t, d, wire.RejectNoXRC)
}

func send(t *testing.T, p *model.Process, ini kernel.QP, srqn uint32) verbs.WCStatus {
	t.Helper()
	if err := p.PostSend(ini, []kernel.SendWR{{WRID: 1, RemoteSRQN: srqn}}); err != nil {
		t.Fatal(err)
	}
	var c [1]kernel.SendCompletion
	if _, err := p.PollSend(ctx5(t), ini, c[:]); err != nil {
		t.Fatal(err)
	}
	return c[0].Status
}

// Concurrent VIRT_REQs for one TGT: one kernel handle, exact local count,
// and all released again, under the race detector.
func TestAcceptorConcurrentShare(t *testing.T) {
	e := newEnv(t)
	_, u := e.phys(e.r1, nil)
	const workers, each = 4, 50
	legs := make(chan *acceptedLeg, workers*each)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				req := wire.Req{Type: wire.TypeVirtReq, ConnTag: uint32(1000 + w*each + i), Incarnation: senderInc,
					INIQPN: u.iniQPN, TGTQPNHint: u.tgtQPN, DomainHint: e.dom.ID, ReplyPort: 30000, Credits: 8, MaxMessage: MaxMessageSize}
				b := make([]byte, wire.BudgetSIDRREQ)
				req.Encode(b)
				d := e.r2.acc.Decide(kernel.Event{Type: kernel.EventConnectRequest, Exchange: kernel.ExchangeSIDR,
					Remote: netip.AddrPortFrom(addrA, 1), PrivateData: b})
				if !d.Accept {
					t.Errorf("rejected: %v", d.Reject.Reason)
					return
				}
				legs <- d.Leg
			}
		})
	}
	wg.Wait()
	close(legs)
	e.expect(u.tgtQPN, 2, 1, workers*each)
	var rel sync.WaitGroup
	for l := range legs {
		rel.Go(func() { e.r2.acc.Release(l) })
	}
	rel.Wait()
	e.expect(u.tgtQPN, 1, 1, 0)
}

// MOVE (a sender rebuilding its uplink): an existing leg moves onto the TGT
// a PHYS_REQ creates or a VIRT_REQ names, keeping its acceptor tag; the
// handle it leaves is unregistered at a local count of zero; a MOVE of an
// unknown leg is refused and makes nothing; a replayed MOVE gets the cached
// ACCEPT.
func TestAcceptorMove(t *testing.T) {
	t.Run("VIRT MOVE to another TGT", func(t *testing.T) {
		e := newEnv(t)
		_, u1 := e.phys(e.r1, nil)
		req := e.virtReq(u1)
		d1 := e.virt(e.r2, req)
		wantAccept(t, d1)
		_, u2 := e.phys(e.r1, func(r *wire.Req) { r.Flags |= wire.FlagReplacesTGT; r.TGTQPNHint = u1.tgtQPN })
		e.expect(u1.tgtQPN, 2, 1, 1)
		mv := req
		mv.Flags, mv.Move = wire.FlagMove, 1
		mv.INIQPN, mv.TGTQPNHint = u2.iniQPN, u2.tgtQPN
		d := e.virt(e.r2, mv)
		wantAccept(t, d)
		if !d.Moved || d.Leg != d1.Leg || d.Leg.Tag != d1.Leg.Tag {
			t.Fatalf("moved=%v, same leg %v, tag %#x want %#x", d.Moved, d.Leg == d1.Leg, d.Leg.Tag, d1.Leg.Tag)
		}
		e.expect(u1.tgtQPN, 1, 1, 0) // r2's handle on the old TGT is gone
		e.expect(u2.tgtQPN, 2, 1, 1)
		if !e.r2.acc.LegAccepts(d.Leg, u1.tgtQPN) || !e.r2.acc.LegAccepts(d.Leg, u2.tgtQPN) {
			t.Fatal("messages queued through the old TGT, or new ones, would be dropped")
		}
		replay := e.virt(e.r2, mv)
		if !replay.Duplicate || !bytes.Equal(replay.PrivateData, d.PrivateData) {
			t.Fatal("replayed MOVE not answered from the cache")
		}
		e.expect(u2.tgtQPN, 2, 1, 1)
	})
	t.Run("PHYS MOVE creates the new TGT", func(t *testing.T) {
		e := newEnv(t)
		d1, u1 := e.phys(e.r1, nil)
		tag := d1.Leg.PeerTag
		d, u2 := e.phys(e.r1, func(r *wire.Req) {
			r.ConnTag, r.Flags, r.TGTQPNHint, r.Move = tag, wire.FlagMove|wire.FlagReplacesTGT, u1.tgtQPN, 1
		})
		wantAccept(t, d)
		if !d.Moved || d.Leg != d1.Leg || !d.Leg.Downlink.Creator {
			t.Fatalf("moved=%v same leg=%v", d.Moved, d.Leg == d1.Leg)
		}
		if e.b.TGTHandles(u1.tgtQPN) != 0 && u1.tgtQPN != u2.tgtQPN {
			t.Fatal("the old TGT outlived its last user")
		}
		e.expect(u2.tgtQPN, 1, 1, 0)
	})
	// A late copy of an earlier recovery's MOVE (or a replay from the
	// sender's node) names a TGT the leg has left, still held for another
	// leg: refused, the leg stays where its sender sends (it went back,
	// and its sender's messages through the new TGT were dropped after the
	// next drain; found by a review).
	t.Run("stale MOVE to a TGT the leg left", func(t *testing.T) {
		e := newEnv(t)
		dp, u1 := e.phys(e.r1, nil) // leg P, TGT1
		l1, l2 := e.virtReq(u1), e.virtReq(u1)
		d1 := e.virt(e.r1, l1)
		wantAccept(t, d1)
		wantAccept(t, e.virt(e.r1, l2))
		gens := map[uint32]uint32{} // each leg's move generation, as its sender counts
		gen := func(tag uint32) uint32 { gens[tag]++; return gens[tag] }
		recovery := func(from rawUplink, legs ...wire.Req) (rawUplink, []wire.Req) {
			_, u := e.phys(e.r1, func(r *wire.Req) {
				r.ConnTag, r.Flags, r.TGTQPNHint = dp.Leg.PeerTag, wire.FlagMove|wire.FlagReplacesTGT, from.tgtQPN
				r.Move = gen(r.ConnTag)
			})
			var moves []wire.Req
			for _, l := range legs {
				mv := l
				mv.Flags, mv.INIQPN, mv.TGTQPNHint, mv.Move = wire.FlagMove, u.iniQPN, u.tgtQPN, gen(l.ConnTag)
				wantAccept(t, e.virt(e.r1, mv))
				moves = append(moves, mv)
			}
			// The old physical link goes, as a recovery ends.
			e.sender.Disconnect(from.aid)
			e.ev(e.r1.p, from.pid, kernel.EventDisconnected)
			e.r1.p.Disconnect(from.pid)
			return u, moves
		}
		u2, first := recovery(u1, l1, l2) // both legs to TGT2
		u3, _ := recovery(u2, l1)         // L1 to TGT3; L2 still on TGT2
		wantReject(t, e.virt(e.r1, first[0]), wire.RejectBadRequest)
		// Nor with its generation edited past the leg's: we hold TGT2,
		// so it is one the leg left, whatever the number says (the
		// generation's first version dropped this check; found by review).
		edited := first[0]
		edited.Move = 3
		wantReject(t, e.virt(e.r1, edited), wire.RejectBadRequest)
		if tgt, _ := e.r1.acc.LegTGT(d1.Leg); tgt != u3.tgtQPN {
			t.Fatalf("the stale MOVE took L1 from TGT3 %#x to %#x", u3.tgtQPN, tgt)
		}
	})
	// A replay of an older MOVE, naming a TGT the leg has left and we no
	// longer hold, which another process keeps alive: opened by number it
	// passes every check of the TGT, so only the move generation tells it
	// from a MOVE its sender made since. Before the generation it moved
	// the leg back, and its sender's messages through its current TGT
	// were dropped.
	t.Run("replayed MOVE naming a TGT another process keeps", func(t *testing.T) {
		e := newEnv(t)
		dp, u0 := e.phys(e.r1, nil) // leg P, TGT0
		l := e.virtReq(u0)
		d := e.virt(e.r1, l) // leg L, TGT0
		wantAccept(t, d)
		move := func(from rawUplink, gen uint32) (rawUplink, wire.Req) {
			_, u := e.phys(e.r1, func(r *wire.Req) {
				r.ConnTag, r.Flags, r.TGTQPNHint, r.Move = dp.Leg.PeerTag, wire.FlagMove|wire.FlagReplacesTGT, from.tgtQPN, gen
			})
			mv := l
			mv.Flags, mv.Move, mv.INIQPN, mv.TGTQPNHint = wire.FlagMove, gen, u.iniQPN, u.tgtQPN
			wantAccept(t, e.virt(e.r1, mv))
			// The old physical link goes, as a recovery ends.
			e.sender.Disconnect(from.aid)
			e.ev(e.r1.p, from.pid, kernel.EventDisconnected)
			e.r1.p.Disconnect(from.pid)
			return u, mv
		}
		u1, m1 := move(u0, 1)
		wantAccept(t, e.virt(e.r2, e.virtReq(u1))) // r2 keeps TGT1
		u2, m2 := move(u1, 2)
		if n := e.r1.acc.LocalCount(u1.tgtQPN); n != 0 || e.b.TGTHandles(u1.tgtQPN) != 1 {
			t.Fatalf("TGT1: r1 count %d, %d kernel handles; want r2's only", n, e.b.TGTHandles(u1.tgtQPN))
		}
		wantReject(t, e.virt(e.r1, m1), wire.RejectBadRequest)
		if tgt, _ := e.r1.acc.LegTGT(d.Leg); tgt != u2.tgtQPN {
			t.Fatalf("the replayed MOVE took L from TGT2 %#x to %#x", u2.tgtQPN, tgt)
		}
		e.expect(u1.tgtQPN, 1, 0, 1) // nothing registered for the replay
		// The latest MOVE asked again is a retransmission: the cached answer.
		if dup := e.virt(e.r1, m2); !dup.Duplicate {
			t.Fatal("the latest MOVE asked again was not answered from the cache")
		}
		// A MOVE naming the leg's own TGT and INI with an older generation
		// (numbers reused since) is no retransmission either.
		old := m2
		old.Move = 1
		wantReject(t, e.virt(e.r1, old), wire.RejectBadRequest)
		// So is a PHYS_REQ MOVE of an older generation (the same one is
		// the same MOVE asked again, decided anew).
		d1, _ := e.phys(e.r1, func(r *wire.Req) {
			r.ConnTag, r.Flags, r.TGTQPNHint, r.Move = dp.Leg.PeerTag, wire.FlagMove|wire.FlagReplacesTGT, u1.tgtQPN, 1
		})
		wantReject(t, d1, wire.RejectBadRequest)
		if tgt, _ := e.r1.acc.LegTGT(dp.Leg); tgt != u2.tgtQPN {
			t.Fatalf("the replayed PHYS MOVE took P from TGT2 %#x to %#x", u2.tgtQPN, tgt)
		}
	})
	t.Run("MOVE of an unknown leg", func(t *testing.T) {
		e := newEnv(t)
		_, u := e.phys(e.r1, nil)
		d, _ := e.phys(e.r1, func(r *wire.Req) { r.Flags, r.Move = wire.FlagMove, 1 })
		wantReject(t, d, wire.RejectBadRequest)
		req := e.virtReq(u)
		req.Flags, req.Move = wire.FlagMove, 1
		wantReject(t, e.virt(e.r2, req), wire.RejectBadRequest)
		e.expect(u.tgtQPN, 1, 1, 0)
		if _, tgt := e.b.QPCount(); tgt != 1 || e.r1.acc.Downlinks() != 1 || e.r2.acc.Downlinks() != 0 {
			t.Fatal("a refused MOVE left something behind")
		}
	})
}

// A closed acceptor registers nothing: a request is refused BUSY_RETRY, and
// a reverse leg (a dial's ACCEPT racing its endpoint's Close) opens no TGT,
// which would outlive the domain's close.
func TestAcceptorClosedRegistersNothing(t *testing.T) {
	e := newEnv(t)
	_, u := e.phys(e.r2, nil) // a TGT r1 could open and verify
	e.r1.acc.Close()
	req := e.nextReq(wire.TypeVirtReq)
	req.INIQPN, req.TGTQPNHint, req.DomainHint = u.iniQPN, u.tgtQPN, u.domain
	wantReject(t, e.virt(e.r1, req), wire.RejectBusyRetry)
	acc := &wire.Accept{Flags: wire.AcceptReverse, Incarnation: senderInc,
		Rev: wire.Reverse{Tag: 9, INIQPN: u.iniQPN, TGTQPN: u.tgtQPN, DomainID: e.dom.ID}}
	if leg, err := e.r1.acc.ReverseLeg(5, 6, acc, addrA, 30000); !errors.Is(err, ErrClosed) {
		t.Fatalf("reverse leg on a closed acceptor: %+v %v", leg, err)
	}
	if n := e.b.TGTHandles(u.tgtQPN); n != 1 {
		t.Fatalf("TGT has %d handles, want r2's only", n)
	}
}

// ReverseLeg (the dialer registering the reverse leg an ACCEPT carries)
// verifies an opened TGT as the acceptor verifies a VIRT_REQ's hint, and
// leaves nothing behind when it refuses: a TGT not in RTR/RTS, one whose
// peer is another node, and a reverse leg into another domain are what an
// honest acceptor may name too (errReverseGone, errReverseDomain: Dial asks
// again by two exchanges); a leg already held is not (errBadReverse).
func TestAcceptorReverseLegVerifies(t *testing.T) {
	cases := []struct {
		name string
		mut  func(e *env, d decision, acc *wire.Accept, from *netip.Addr)
		want error
	}{
		{"the sender's TGT, from its node: registered", nil, nil},
		{"TGT in ERR", func(e *env, d decision, _ *wire.Accept, _ *netip.Addr) {
			if err := e.r1.p.TransitionQP(d.Leg.Downlink.qp, verbs.QPStateErr, 0); err != nil {
				e.t.Fatal(err)
			}
		}, errReverseGone},
		{"ACCEPT from another node", func(_ *env, _ decision, _ *wire.Accept, from *netip.Addr) { *from = addrC }, errReverseGone},
		{"another domain", func(_ *env, _ decision, acc *wire.Accept, _ *netip.Addr) { acc.Rev.DomainID++ }, errReverseDomain},
		{"a leg already held", func(e *env, _ decision, acc *wire.Accept, _ *netip.Addr) {
			wantAccept(e.t, e.virt(e.r2, e.virtReq(rawUplink{iniQPN: acc.Rev.INIQPN, tgtQPN: acc.Rev.TGTQPN, domain: e.dom.ID})))
			acc.Rev.Tag = e.tag // that VIRT_REQ's conn tag
		}, errBadReverse},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			d, u := e.phys(e.r1, nil) // the sender's TGT in r2's node, made by r1
			acc := &wire.Accept{Flags: wire.AcceptReverse, Incarnation: senderInc, SRQN: 0x99,
				Rev: wire.Reverse{Tag: 0x5EED, INIQPN: u.iniQPN, TGTQPN: u.tgtQPN, DomainID: e.dom.ID}}
			from := addrA
			if tc.mut != nil {
				tc.mut(e, d, acc, &from)
			}
			handles, legs, dls := e.r2.p.Handles(), e.r2.acc.LocalCounts(), e.r2.acc.Downlinks()
			leg, err := e.r2.acc.ReverseLeg(e.r2.acc.ReserveTag(), 1, acc, from, 30000)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if tgt, ok := e.r2.acc.LegTGT(leg); !ok || tgt != u.tgtQPN {
					t.Fatalf("leg on %#x (registered %v), want %#x", tgt, ok, u.tgtQPN)
				}
				e.expect(u.tgtQPN, 2, 1, 1)
				return
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("ReverseLeg: %v, want %v", err, tc.want)
			}
			if e.r2.p.Handles() != handles || e.r2.acc.LocalCounts() != legs || e.r2.acc.Downlinks() != dls {
				t.Fatalf("r2 after the refusal: %d handles, %d legs, %d downlinks; was %d, %d, %d",
					e.r2.p.Handles(), e.r2.acc.LocalCounts(), e.r2.acc.Downlinks(), handles, legs, dls)
			}
		})
	}
}

// A MOVE from the leg's node naming the leg's own TGT and INI (a no-op
// move) changes nothing, its generation included: a forged one with a huge
// generation had every later MOVE of its sender refused BAD_REQUEST, and
// the next recovery failed the connection (found by review).
func TestAcceptorNoOpMoveAdvancesNothing(t *testing.T) {
	e := newEnv(t)
	dp, u0 := e.phys(e.r1, nil) // leg P makes the uplink, TGT0
	l := e.virtReq(u0)
	d := e.virt(e.r1, l) // leg L on TGT0, generation 0
	wantAccept(t, d)
	// The forged MOVE: L's own TGT and INI, generation 2^32-1.
	forged := l
	forged.Flags, forged.Move = wire.FlagMove, ^uint32(0)
	e.virt(e.r1, forged)
	if tgt, _ := e.r1.acc.LegTGT(d.Leg); tgt != u0.tgtQPN {
		t.Fatalf("the forged MOVE moved L to %#x", tgt)
	}
	// The sender's next recovery: PHYS MOVE of P (its first), VIRT MOVE of L
	// (its first), both numbered 1.
	_, u1 := e.phys(e.r1, func(r *wire.Req) {
		r.ConnTag, r.Flags, r.TGTQPNHint, r.Move = dp.Leg.PeerTag, wire.FlagMove|wire.FlagReplacesTGT, u0.tgtQPN, 1
	})
	mv := l
	mv.Flags, mv.Move, mv.INIQPN, mv.TGTQPNHint = wire.FlagMove, 1, u1.iniQPN, u1.tgtQPN
	got := e.virt(e.r1, mv)
	if !got.Accept {
		t.Fatalf("the sender's own MOVE of L was refused %v after a forged no-op MOVE", got.Reject.Reason)
	}
	e.sender.Disconnect(u0.aid)
	e.ev(e.r1.p, u0.pid, kernel.EventDisconnected)
	e.r1.p.Disconnect(u0.pid)
}

// TestAcceptorMoveBackToHeldTGTAfterPrune: xrc-protocol.md says a MOVE
// back to a TGT the leg left is refused whatever its generation "while we
// hold the TGT the leg left". The acceptor checks only the TGTs the leg
// still remembers (its last maxPrev, forgotten once the SRQ drains past the
// move): a leg moved five times, with drains between, forgets the first
// TGT while our handle on it lives on for another leg of the same sender,
// and a MOVE back to it with a larger generation is taken.
func TestAcceptorMoveBackToHeldTGTAfterPrune(t *testing.T) {
	e := newEnv(t)
	var drains, polls atomic.Uint64
	e.r2.acc.cfg.Drains, e.r2.acc.cfg.Polls = drains.Load, polls.Load
	var ups []rawUplink
	for range 6 {
		_, u := e.phys(e.r1, nil)
		ups = append(ups, u)
	}
	// Another leg of the sender keeps r2's handle on the first TGT.
	wantAccept(t, e.virt(e.r2, e.virtReq(ups[0])))
	req := e.virtReq(ups[0])
	wantAccept(t, e.virt(e.r2, req))
	for i := 1; i < len(ups); i++ {
		polls.Add(1)
		drains.Add(2) // the SRQ drained past the last move
		mv := req
		mv.Flags, mv.Move = wire.FlagMove, uint32(i)
		mv.INIQPN, mv.TGTQPNHint = ups[i].iniQPN, ups[i].tgtQPN
		wantAccept(t, e.virt(e.r2, mv))
	}
	if e.r2.acc.LocalCount(ups[0].tgtQPN) == 0 {
		t.Fatal("r2 holds no handle on the first TGT")
	}
	back := req
	back.Flags, back.Move = wire.FlagMove, 1000
	d := e.virt(e.r2, back)
	if d.Accept {
		t.Fatalf("a MOVE back to the first TGT, which r2 still holds, was taken (moved=%v)", d.Moved)
	}
}
