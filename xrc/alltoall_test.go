package xrc

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/internal/kernel/model"
	"github.com/goxrc/goxrc/verbs"
	"github.com/goxrc/goxrc/xrc/internal/wire"
)

// peerProc is a process that both sends and receives.
type peerProc struct {
	n      *model.Node
	p      *model.Process
	d      kernel.XRCD
	srq    kernel.SRQ
	srqn   uint32
	acc    *acceptor
	port   uint16
	lx, lu kernel.ID
	inc    uint64
	up     map[netip.Addr]*rawUplink // one INI per remote node
	tag    uint32
}

func (s *peerProc) event(t *testing.T, id kernel.ID, want kernel.EventType) kernel.Event {
	t.Helper()
	e, err := s.p.Event(ctx5(t), id)
	if err != nil || e.Type != want {
		t.Fatalf("event %v %v, want %v", e.Type, err, want)
	}
	return e
}

// dial opens a leg from s to r: a PHYS_REQ if s has no rawUplink to r's node
// yet, else a VIRT_REQ over the existing one.
func dial(t *testing.T, s, r *peerProc) {
	t.Helper()
	s.tag++
	req := wire.Req{ConnTag: s.tag, Incarnation: s.inc, SRQN: s.srqn, ReplyPort: 30000, Credits: 8, MaxMessage: MaxMessageSize}
	dst := netip.AddrPortFrom(r.n.Addr(), r.port)
	u := s.up[r.n.Addr()]
	if u == nil {
		ini, iniQPN, err := s.p.CreateINI()
		if err != nil {
			t.Fatal(err)
		}
		req.Type, req.INIQPN = wire.TypePhysReq, iniQPN
		b := make([]byte, wire.BudgetREQ)
		n, _ := req.Encode(b)
		aid, err := s.p.Connect(ctx5(t), dst, kernel.ExchangeXRC, iniQPN, b[:n])
		if err != nil {
			t.Fatal(err)
		}
		cr := r.event(t, r.lx, kernel.EventConnectRequest)
		d := r.acc.Decide(cr)
		if !d.Accept {
			t.Fatalf("PHYS_REQ rejected: %v", d.Reject.Reason)
		}
		if err := r.p.Accept(cr.ID, d.QPNum, d.PrivateData); err != nil {
			t.Fatal(err)
		}
		resp := s.event(t, aid, kernel.EventConnectResponse)
		var acc wire.Accept
		if err := wire.DecodeAccept(resp.PrivateData, &acc); err != nil {
			t.Fatal(err)
		}
		if err := s.p.TransitionQP(ini, verbs.QPStateRTS, aid); err != nil {
			t.Fatal(err)
		}
		if err := s.p.Establish(aid); err != nil {
			t.Fatal(err)
		}
		r.event(t, cr.ID, kernel.EventEstablished)
		s.up[r.n.Addr()] = &rawUplink{ini: ini, iniQPN: iniQPN, tgtQPN: acc.TGTQPN, domain: acc.DomainID, aid: aid, pid: cr.ID}
		return
	}
	req.Type, req.INIQPN, req.TGTQPNHint, req.DomainHint = wire.TypeVirtReq, u.iniQPN, u.tgtQPN, u.domain
	b := make([]byte, wire.BudgetSIDRREQ)
	n, _ := req.Encode(b)
	sid, err := s.p.Connect(ctx5(t), dst, kernel.ExchangeSIDR, 0, b[:n])
	if err != nil {
		t.Fatal(err)
	}
	cr := r.event(t, r.lu, kernel.EventConnectRequest)
	d := r.acc.Decide(cr)
	if !d.Accept {
		t.Fatalf("VIRT_REQ rejected: %v", d.Reject.Reason)
	}
	if err := r.p.Accept(cr.ID, d.QPNum, d.PrivateData); err != nil {
		t.Fatal(err)
	}
	s.event(t, sid, kernel.EventEstablished)
	s.p.DestroyID(sid) // the virtual link needs no CM state afterwards
	r.p.DestroyID(cr.ID)
}

// TestQPCountAllToAll is the point of XRC: N nodes with P processes each,
// every process connected to every process on the other nodes, costs each
// node P*(N-1) INIs and P*(N-1) TGTs (2*P*(N-1)), where RC needs P*P*(N-1);
// each TGT has one kernel handle per local receiver; and every message
// reaches the right receiver through the sender's single INI to that node.
func TestQPCountAllToAll(t *testing.T) {
	const N, P = 3, 3
	f := model.NewFabric(model.ReuseLIFO)
	var procs [N][P]*peerProc
	for i := range N {
		node := f.AddNode(netip.MustParseAddr(fmt.Sprintf("10.0.1.%d", i+1)), model.NodeConfig{})
		dom, err := OpenDomainFile(context.Background(), filepath.Join(t.TempDir(), "goxrc"))
		if err != nil {
			t.Fatal(err)
		}
		for j := range P {
			s := &peerProc{n: node, p: node.NewProcess(), port: uint16(20000 + j), inc: uint64(i<<8 | j + 1), up: map[netip.Addr]*rawUplink{}}
			if s.d, err = s.p.OpenXRCD(dom.Path, kernel.XRCDCreate); err != nil {
				t.Fatal(err)
			}
			if s.srq, s.srqn, err = s.p.CreateSRQ(s.d, frameSize(MaxMessageSize)); err != nil {
				t.Fatal(err)
			}
			s.acc = newAcceptor(acceptorConfig{Kernel: s.p, XRCD: s.d, DomainID: dom.ID, Incarnation: s.inc, SRQN: s.srqn})
			ap := netip.AddrPortFrom(node.Addr(), s.port)
			if s.lx, err = s.p.Listen(ap, kernel.ExchangeXRC); err != nil {
				t.Fatal(err)
			}
			if s.lu, err = s.p.Listen(ap, kernel.ExchangeSIDR); err != nil {
				t.Fatal(err)
			}
			procs[i][j] = s
		}
	}
	for i := range N {
		for j := range P {
			for k := range N {
				if k == i {
					continue
				}
				for l := range P {
					dial(t, procs[i][j], procs[k][l])
				}
			}
		}
	}
	for i := range N {
		n := procs[i][0].n
		ini, tgt := n.QPCount()
		if ini != P*(N-1) || tgt != P*(N-1) {
			t.Errorf("node %d: %d INI + %d TGT, want %d + %d (RC would need %d)", i, ini, tgt, P*(N-1), P*(N-1), P*P*(N-1))
		}
		for k := range N {
			for l := range P {
				if u := procs[k][l].up[n.Addr()]; u != nil {
					if h := n.TGTHandles(u.tgtQPN); h != P {
						t.Errorf("node %d: TGT %#x has %d handles, want %d", i, u.tgtQPN, h, P)
					}
				}
			}
		}
	}
	// Every sender reaches every remote receiver through its one INI.
	for i := range N {
		for j := range P {
			s := procs[i][j]
			for k := range N {
				if k == i {
					continue
				}
				u := s.up[procs[k][0].n.Addr()]
				for l := range P {
					r := procs[k][l]
					if st := send(t, s.p, u.ini, r.srqn); st != verbs.WCSuccess {
						t.Fatalf("%d.%d -> %d.%d: %v", i, j, k, l, st)
					}
					var c [1]kernel.RecvCompletion
					if _, err := r.p.PollRecv(ctx5(t), r.srq, c[:]); err != nil || c[0].TGTQPN != u.tgtQPN {
						t.Fatalf("%d.%d -> %d.%d: %v via %#x, want %#x", i, j, k, l, err, c[0].TGTQPN, u.tgtQPN)
					}
				}
			}
		}
	}
}
