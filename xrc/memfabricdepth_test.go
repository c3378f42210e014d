package xrc

import (
	"errors"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/verbs"
)

// memfabric.NodeConfig.SendQueueDepth: "Default 256, what the engine asks of
// a real device": on a node made with the zero NodeConfig (Fabric.Node) a
// post finds an INI's send queue full (ENOMEM) once 256 sends wait for their
// completions to be polled, and not before.
func TestMemfabricDefaultSendQueueDepth(t *testing.T) {
	w := newWorld(t)
	a, b := w.rawKernel("10.0.211.1"), w.rawKernel("10.0.211.2")
	dir := t.TempDir() + "/goxrc"
	dom, err := OpenDomainFile(ctxT(t, 5*time.Second), dir)
	if err != nil {
		t.Fatal(err)
	}
	d, err := b.OpenXRCD(dom.Path, kernel.XRCDCreate)
	if err != nil {
		t.Fatal(err)
	}
	_, srqn, err := b.CreateSRQ(d, 64)
	if err != nil {
		t.Fatal(err)
	}
	ap := netip.MustParseAddrPort("10.0.211.2:7000")
	l, err := b.Listen(ap, kernel.ExchangeXRC)
	if err != nil {
		t.Fatal(err)
	}
	ini, iniQPN, err := a.CreateINI()
	if err != nil {
		t.Fatal(err)
	}
	aid, err := a.Connect(ctxT(t, 5*time.Second), ap, kernel.ExchangeXRC, iniQPN, []byte("req"))
	if err != nil {
		t.Fatal(err)
	}
	req, err := b.Event(ctxT(t, 5*time.Second), l)
	if err != nil || req.Type != kernel.EventConnectRequest {
		t.Fatalf("REQ: %v %v", req.Type, err)
	}
	tgt, tgtQPN, err := b.CreateTGT(d)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.TransitionQP(tgt, verbs.QPStateRTR, req.ID); err != nil {
		t.Fatal(err)
	}
	if err := b.Accept(req.ID, tgtQPN, []byte("rep")); err != nil {
		t.Fatal(err)
	}
	if ev, err := a.Event(ctxT(t, 5*time.Second), aid); err != nil || ev.Type != kernel.EventConnectResponse {
		t.Fatalf("REP: %v %v", ev.Type, err)
	}
	if err := a.TransitionQP(ini, verbs.QPStateRTS, aid); err != nil {
		t.Fatal(err)
	}
	if err := a.Establish(aid); err != nil {
		t.Fatal(err)
	}
	const depth = 256
	for i := range depth {
		if err := a.PostSend(ini, []kernel.SendWR{{WRID: uint64(i), RemoteSRQN: srqn, Imm: 1, Payload: []byte{1}}}); err != nil {
			t.Fatalf("post %d of %d on a default node: %v", i+1, depth, err)
		}
	}
	err = a.PostSend(ini, []kernel.SendWR{{WRID: depth, RemoteSRQN: srqn, Imm: 1, Payload: []byte{1}}})
	if !errors.Is(err, syscall.ENOMEM) {
		t.Fatalf("post %d with %d completions unpolled: %v, want ENOMEM", depth+1, depth, err)
	}
}
