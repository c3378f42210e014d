package hybrid

import (
	"context"
	"errors"
	"net/netip"
	"syscall"
	"testing"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/internal/kernel/kcm"
	"github.com/goxrc/goxrc/internal/kernel/model"
	"github.com/goxrc/goxrc/verbs"
)

func TestQPNTranslation(t *testing.T) {
	f := NewFabric(model.ReuseNever)
	first, second := f.offset(netip.MustParseAddr("10.9.0.1")), f.offset(netip.MustParseAddr("10.9.0.2"))
	if first != QPNOffset || second != QPNOffset+nodeQPNSpan || f.offset(netip.MustParseAddr("10.9.0.1")) != first {
		t.Fatalf("offsets %#x, %#x: want %#x and one span more, each node's for good", first, second, QPNOffset)
	}
	for _, off := range []uint32{first, second} {
		for _, m := range []uint32{0x11, 0x12345, 0x8FFFFF, 0xFFFFFF} {
			if got := toModel(toWire(m, off), off); got != m {
				t.Errorf("toModel(toWire(%#x)) = %#x", m, got)
			}
		}
	}
	if toWire(0x11, first) != 0x700011 || toWire(0x11, second) != 0x710011 || toWire(0, first) != 0 || toModel(0, first) != 0 {
		t.Errorf("toWire(0x11) = %#x, %#x", toWire(0x11, first), toWire(0x11, second))
	}
}

// One node whatever the spelling of its address: a zone or a v4-mapped
// form made a second model node, numbers of its own, and a phantom peer.
func TestNodeKeyIgnoresZoneAndMapping(t *testing.T) {
	f := NewFabric(model.ReuseNever)
	for _, pair := range [][2]string{{"fe80::1", "fe80::1%eth0"}, {"fe80::1", "fe80::1%2"}, {"10.9.0.1", "::ffff:10.9.0.1"}} {
		a, b := netip.MustParseAddr(pair[0]), netip.MustParseAddr(pair[1])
		if f.offset(a) != f.offset(b) || f.Node(a) != f.Node(b) {
			t.Errorf("%s and %s are two nodes (offsets %#x, %#x)", a, b, f.offset(a), f.offset(b))
		}
	}
}

// TestShadowPath sets the paths of an INI and a TGT on one model node through
// the private exchanges, as TransitionQP does with a real id's path, and
// sends through them.
func TestShadowPath(t *testing.T) {
	ip := netip.MustParseAddr("10.9.0.1")
	f := NewFabric(model.ReuseLIFO)
	a, b := f.Node(ip).NewProcess(), f.Node(ip).NewProcess()
	ini, iniN, err := a.CreateINI()
	if err != nil {
		t.Fatal(err)
	}
	d, err := b.OpenXRCD("", kernel.XRCDCreate)
	if err != nil {
		t.Fatal(err)
	}
	srq, srqN, err := b.CreateSRQ(d, 1<<16)
	if err != nil {
		t.Fatal(err)
	}
	tgt, tgtN, err := b.CreateTGT(d)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ { // repeated: no shadow state may linger
		for _, q := range []struct {
			p    *model.Process
			h    kernel.QP
			peer uint32
		}{{b, tgt, iniN}, {a, ini, tgtN}} {
			if err := b.TransitionQP(tgt, verbs.QPStateReset, 0); err != nil {
				t.Fatal(err)
			}
			if err := a.TransitionQP(ini, verbs.QPStateReset, 0); err != nil {
				t.Fatal(err)
			}
			info, _ := q.p.QueryQP(q.h)
			path := kcm.Path{RemoteQPN: toWire(q.peer, QPNOffset), Remote: netip.AddrPortFrom(ip, 7), Exchange: kernel.ExchangeXRC}
			if err := f.withPath(q.p, kernel.QPInfo{Num: info.Num, Type: info.Type}, path, func(id kernel.ID) error { // the model's number, as TransitionQP passes it
				return q.p.TransitionQP(q.h, verbs.QPStateRTS, id)
			}); err != nil {
				t.Fatal(err)
			}
			info, _ = q.p.QueryQP(q.h)
			if info.State != verbs.QPStateRTS || info.DestQPN != q.peer || info.Remote != ip {
				t.Fatalf("after the shadow exchange: %+v, want RTS to %#x at %s", info, q.peer, ip)
			}
		}
		if n := f.Node(ip).StaleEntries(); n != 0 {
			t.Fatalf("%d stale entries left by shadow exchanges", n)
		}
	}
	// Both paths set: a send arrives. (The loop's last pass reset the TGT.)
	path := kcm.Path{RemoteQPN: toWire(iniN, QPNOffset), Remote: netip.AddrPortFrom(ip, 7), Exchange: kernel.ExchangeXRC}
	if err := f.withPath(b, kernel.QPInfo{Type: verbs.QPTypeXRCRecv}, path, func(id kernel.ID) error {
		return b.TransitionQP(tgt, verbs.QPStateRTS, id)
	}); err != nil {
		t.Fatal(err)
	}
	if err := a.PostSend(ini, []kernel.SendWR{{WRID: 1, RemoteSRQN: srqN, Imm: 9, Payload: []byte("x")}}); err != nil {
		t.Fatal(err)
	}
	var rc [1]kernel.RecvCompletion
	if n, err := b.PollRecv(context.Background(), srq, rc[:]); n != 1 || err != nil || rc[0].Imm != 9 {
		t.Fatalf("PollRecv = %d, %v, %+v", n, err, rc[0])
	}
	if h := f.helpers[f.Node(ip)].Handles(); h != 0 {
		t.Errorf("helper holds %d handles", h)
	}
}

// A node's shown numbers stop before the next node's begin: past its span
// a new QP failed to show it and took a number that was the next node's.
func TestNodeNumbersDoNotReachTheNext(t *testing.T) {
	f := NewFabric(model.ReuseNever)
	addr := netip.MustParseAddr("10.9.0.1")
	p := &Process{f: f, off: f.offset(addr), m: f.Node(addr).NewProcess()}
	next := f.offset(netip.MustParseAddr("10.9.0.2"))
	var last uint32
	for i := 0; ; i++ {
		q, n, err := p.CreateINI()
		if err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("INI %d: %v, want ENOSPC", i, err)
			}
			break
		}
		if n >= next {
			t.Fatalf("INI %d shows %#x, the next node's numbers start at %#x", i, n, next)
		}
		last = n
		if err := p.m.DestroyQP(q); err != nil {
			t.Fatal(err)
		}
		if i > 2*nodeQPNSpan {
			t.Fatal("no end to a node's numbers")
		}
	}
	if last != next-1 {
		t.Fatalf("the last number shown %#x, want the span's last, %#x", last, next-1)
	}
	if h := p.m.Handles(); h != 0 {
		t.Fatalf("%d handles left: the refused QP was kept", h)
	}
}
