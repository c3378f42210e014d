package model

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/verbs"
)

var (
	addrA = netip.MustParseAddr("10.0.0.1")
	addrB = netip.MustParseAddr("10.0.0.2")
)

const port = 20002

// testSlot is the receive size of the tests' SRQs.
const testSlot = 4096

func twoNodes(t *testing.T, reuse Reuse) (*Fabric, *Node, *Node) {
	t.Helper()
	f := NewFabric(reuse)
	return f, f.AddNode(addrA, NodeConfig{}), f.AddNode(addrB, NodeConfig{})
}

func domainFile(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "xrcd")
	if err := os.WriteFile(p, []byte("id"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func must[T any](t *testing.T) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

func ok(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func isErrno(err error, e syscall.Errno) bool { return errors.Is(err, e) }

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// event waits for the next event on id and checks its type.
func event(t *testing.T, p *Process, id kernel.ID, want kernel.EventType) kernel.Event {
	t.Helper()
	e, err := p.Event(ctxT(t), id)
	if err != nil {
		t.Fatalf("waiting for %v: %v", want, err)
	}
	if e.Type != want {
		t.Fatalf("got event %v (status %d), want %v", e.Type, e.Status, want)
	}
	return e
}

// noEvent checks that id has nothing queued.
func noEvent(t *testing.T, p *Process, id kernel.ID) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if e, err := p.Event(ctx, id); err == nil {
		t.Fatalf("unexpected event %v (status %d)", e.Type, e.Status)
	}
}

// side is one process with a domain and an SRQ.
type side struct {
	p    *Process
	d    kernel.XRCD
	srq  kernel.SRQ
	srqn uint32
}

func newSide(t *testing.T, n *Node, path string) *side {
	t.Helper()
	s := &side{p: n.NewProcess()}
	s.d = must[kernel.XRCD](t)(s.p.OpenXRCD(path, kernel.XRCDCreate))
	var err error
	s.srq, s.srqn, err = s.p.CreateSRQ(s.d, testSlot)
	ok(t, err)
	return s
}

// link is one physical XRC link: INI on the active side, TGT on the passive.
type link struct {
	ini, tgt       kernel.QP
	iniQPN, tgtQPN uint32
	aid, pid       kernel.ID // active and passive CM ids
}

// physLink runs the whole physical exchange from a to the listener l of b.
func physLink(t *testing.T, a, b *side, l kernel.ID) link {
	t.Helper()
	k := physRequest(t, a, b, l)
	var err error
	k.tgt, k.tgtQPN, err = b.p.CreateTGT(b.d)
	ok(t, err)
	ok(t, b.p.TransitionQP(k.tgt, verbs.QPStateRTR, k.pid))
	ok(t, b.p.Accept(k.pid, k.tgtQPN, []byte("rep")))
	rep := event(t, a.p, k.aid, kernel.EventConnectResponse)
	if rep.QPNum != k.tgtQPN {
		t.Fatalf("REP qp_num %#x, want %#x", rep.QPNum, k.tgtQPN)
	}
	ok(t, a.p.TransitionQP(k.ini, verbs.QPStateRTS, k.aid))
	ok(t, a.p.Establish(k.aid))
	event(t, b.p, k.pid, kernel.EventEstablished)
	return k
}

// physRequest is physLink's first half: a's new INI (k.ini, k.iniQPN), its
// connect (k.aid), and the REQ read at b's listener l (k.pid).
func physRequest(t *testing.T, a, b *side, l kernel.ID) link {
	t.Helper()
	var k link
	var err error
	k.ini, k.iniQPN, err = a.p.CreateINI()
	ok(t, err)
	k.aid = must[kernel.ID](t)(a.p.Connect(ctxT(t), netip.AddrPortFrom(b.p.LocalAddr(), port), kernel.ExchangeXRC, k.iniQPN, []byte("req")))
	req := event(t, b.p, l, kernel.EventConnectRequest)
	if req.QPNum != k.iniQPN {
		t.Fatalf("REQ qp_num %#x, want %#x", req.QPNum, k.iniQPN)
	}
	k.pid = req.ID
	return k
}

func listen(t *testing.T, p *Process, ex kernel.Exchange) kernel.ID {
	t.Helper()
	return must[kernel.ID](t)(p.Listen(netip.AddrPortFrom(p.LocalAddr(), port), ex))
}

func send(t *testing.T, p *Process, ini kernel.QP, srqn, imm uint32, payload string) kernel.SendCompletion {
	t.Helper()
	ok(t, p.PostSend(ini, []kernel.SendWR{{WRID: 1, RemoteSRQN: srqn, Imm: imm, Payload: []byte(payload)}}))
	var c [1]kernel.SendCompletion
	must[int](t)(p.PollSend(ctxT(t), ini, c[:]))
	return c[0]
}

func recv(t *testing.T, s *side) kernel.RecvCompletion {
	t.Helper()
	var c [1]kernel.RecvCompletion
	must[int](t)(s.p.PollRecv(ctxT(t), s.srq, c[:]))
	return c[0]
}

func addrPort(a netip.Addr) netip.AddrPort { return netip.AddrPortFrom(a, port) }

func contextShort() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 20*time.Millisecond)
}

// teardown disconnects a link gracefully from the INI side and destroys both
// CM ids after TIMEWAIT_EXIT (the QPs stay).
func teardown(t *testing.T, a, b *side, k link) {
	t.Helper()
	ok(t, a.p.Disconnect(k.aid))
	event(t, b.p, k.pid, kernel.EventDisconnected)
	ok(t, b.p.Disconnect(k.pid))
	event(t, b.p, k.pid, kernel.EventTimewaitExit)
	event(t, a.p, k.aid, kernel.EventDisconnected)
	event(t, a.p, k.aid, kernel.EventTimewaitExit)
	ok(t, a.p.DestroyID(k.aid))
	ok(t, b.p.DestroyID(k.pid))
}
