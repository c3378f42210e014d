package model

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/verbs"
)

// Rule: no XRCD for the inode and no O_CREAT: EAGAIN.
func TestModelXRCDEAGAIN(t *testing.T) {
	_, a, _ := twoNodes(t, ReuseLIFO)
	p := a.NewProcess()
	path := domainFile(t)
	if _, err := p.OpenXRCD(path, 0); !isErrno(err, syscall.EAGAIN) {
		t.Fatalf("open without create: %v", err)
	}
	d := must[kernel.XRCD](t)(p.OpenXRCD(path, kernel.XRCDCreate))
	q := a.NewProcess()
	d2 := must[kernel.XRCD](t)(q.OpenXRCD(path, 0)) // exists now: no flag needed
	ok(t, p.CloseXRCD(d))
	ok(t, q.CloseXRCD(d2))
	if _, err := p.OpenXRCD(path, 0); !isErrno(err, syscall.EAGAIN) {
		t.Fatalf("domain outlived its last handle: %v", err)
	}
}

// A missing domain file is created with XRCDCreate (verbs.Context.OpenXRCD
// opens it O_CREAT, as the real seam does), and without it the open fails
// with the file's ENOENT.
func TestModelXRCDCreatesFile(t *testing.T) {
	_, a, _ := twoNodes(t, ReuseLIFO)
	p := a.NewProcess()
	path := filepath.Join(t.TempDir(), "domain")
	if _, err := p.OpenXRCD(path, 0); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("open of a missing file without create: %v", err)
	}
	d := must[kernel.XRCD](t)(p.OpenXRCD(path, kernel.XRCDCreate))
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("the domain file was not created: %v", err)
	}
	ok(t, p.CloseXRCD(d))
}

// Rule: O_EXCL on an existing XRCD: EINVAL.
func TestModelXRCDEINVAL(t *testing.T) {
	_, a, _ := twoNodes(t, ReuseLIFO)
	path := domainFile(t)
	p := a.NewProcess()
	must[kernel.XRCD](t)(p.OpenXRCD(path, kernel.XRCDCreate|kernel.XRCDExcl))
	if _, err := a.NewProcess().OpenXRCD(path, kernel.XRCDCreate|kernel.XRCDExcl); !isErrno(err, syscall.EINVAL) {
		t.Fatalf("excl on existing: %v", err)
	}
}

// Rule: EBUSY only from close while this process has QPs/SRQs in the domain.
func TestModelXRCDEBUSY(t *testing.T) {
	_, a, _ := twoNodes(t, ReuseLIFO)
	s := newSide(t, a, domainFile(t))
	if err := s.p.CloseXRCD(s.d); !isErrno(err, syscall.EBUSY) {
		t.Fatalf("close with SRQ: %v", err)
	}
	ok(t, s.p.DestroySRQ(s.srq))
	tgt, _, err := s.p.CreateTGT(s.d)
	ok(t, err)
	if err := s.p.CloseXRCD(s.d); !isErrno(err, syscall.EBUSY) {
		t.Fatalf("close with TGT: %v", err)
	}
	ok(t, s.p.DestroyQP(tgt))
	ok(t, s.p.CloseXRCD(s.d))
}

// Rule: the domain is the inode: unlink and recreate splits the node.
func TestModelXRCDUnlinkRecreateSplits(t *testing.T) {
	_, a, _ := twoNodes(t, ReuseLIFO)
	path := domainFile(t)
	s1 := newSide(t, a, path)
	tgt, qpn, err := s1.p.CreateTGT(s1.d)
	ok(t, err)
	_ = tgt
	ok(t, os.Remove(path))
	ok(t, os.WriteFile(path, []byte("new"), 0o600))
	p2 := a.NewProcess()
	if _, err := p2.OpenXRCD(path, 0); !isErrno(err, syscall.EAGAIN) {
		t.Fatalf("recreated file found the old domain: %v", err)
	}
	d2 := must[kernel.XRCD](t)(p2.OpenXRCD(path, kernel.XRCDCreate))
	if a.XRCDs() != 2 {
		t.Fatalf("%d domains, want 2", a.XRCDs())
	}
	if _, err := p2.OpenTGT(d2, qpn); !isErrno(err, syscall.EINVAL) {
		t.Fatalf("TGT of the old domain opened from the new one: %v", err)
	}
}

// Rule: same inode, same domain: another process opens the TGT; a private
// domain (fd -1) is nobody else's.
func TestModelXRCDSharedByInodePrivateNot(t *testing.T) {
	_, a, _ := twoNodes(t, ReuseLIFO)
	path := domainFile(t)
	s1 := newSide(t, a, path)
	_, qpn, err := s1.p.CreateTGT(s1.d)
	ok(t, err)
	p2 := a.NewProcess()
	d2 := must[kernel.XRCD](t)(p2.OpenXRCD(path, 0))
	must[kernel.QP](t)(p2.OpenTGT(d2, qpn))
	priv := must[kernel.XRCD](t)(p2.OpenXRCD("", kernel.XRCDCreate))
	if _, err := p2.OpenTGT(priv, qpn); !isErrno(err, syscall.EINVAL) {
		t.Fatalf("private domain opened a shared TGT: %v", err)
	}
}

// Rule: rxe-like devices have no XRC: EOPNOTSUPP, which is ErrNotSupported.
func TestModelNoXRCDevice(t *testing.T) {
	f := NewFabric(ReuseLIFO)
	n := f.AddNode(addrA, NodeConfig{NoXRC: true})
	p := n.NewProcess()
	if p.XRC() {
		t.Fatal("XRC reported")
	}
	_, err := p.OpenXRCD(domainFile(t), kernel.XRCDCreate)
	if !errors.Is(err, verbs.ErrNotSupported) || !isErrno(err, syscall.EOPNOTSUPP) {
		t.Fatalf("%v", err)
	}
	// Nor an XRC send QP, which needs no domain (TestVerbsXRCQPsOnRXE has
	// rxe's answer).
	if _, _, err := p.CreateINI(); !isErrno(err, syscall.EOPNOTSUPP) || p.Handles() != 0 || n.Counts().INIs != 0 {
		t.Fatalf("INI on a device without XRC: %v, %d handles, %d INIs", err, p.Handles(), n.Counts().INIs)
	}
}

// Rule: the creator gets a handle like everyone; open adds one; destroying
// any handle (the creator's included) removes that one; the TGT dies with
// the last.
func TestModelTGTDiesWithLastHandle(t *testing.T) {
	_, a, _ := twoNodes(t, ReuseNever)
	path := domainFile(t)
	s1, s2 := newSide(t, a, path), newSide(t, a, path)
	tgt, qpn, err := s1.p.CreateTGT(s1.d)
	ok(t, err)
	h2 := must[kernel.QP](t)(s2.p.OpenTGT(s2.d, qpn))
	h3 := must[kernel.QP](t)(s2.p.OpenTGT(s2.d, qpn)) // a second handle in one process counts too
	if n := a.TGTHandles(qpn); n != 3 || a.TGTHandleTotal() != 3 {
		t.Fatalf("use count %d (node total %d), want 3", n, a.TGTHandleTotal())
	}
	ok(t, s1.p.DestroyQP(tgt)) // the creator leaves first: returns 0, TGT lives
	if _, tg := a.QPCount(); tg != 1 || a.TGTHandles(qpn) != 2 || a.TGTHandleTotal() != 2 {
		t.Fatalf("TGT died with the creator's handle")
	}
	if err := s1.p.DestroyQP(tgt); !isErrno(err, syscall.EBADF) {
		t.Fatalf("double destroy: %v", err)
	}
	ok(t, s2.p.DestroyQP(h2))
	if _, tg := a.QPCount(); tg != 1 {
		t.Fatal("TGT died before its last handle")
	}
	ok(t, s2.p.DestroyQP(h3))
	if _, tg := a.QPCount(); tg != 0 || a.TGTHandleTotal() != 0 {
		t.Fatal("TGT outlived its last handle")
	}
	if _, err := s2.p.OpenTGT(s2.d, qpn); !isErrno(err, syscall.EINVAL) {
		t.Fatalf("open of a dead TGT: %v", err)
	}
}

// Rule: open of an unknown QPN fails (EINVAL), and an INI's number is not a TGT.
func TestModelOpenUnknownQPNFails(t *testing.T) {
	_, a, _ := twoNodes(t, ReuseLIFO)
	s := newSide(t, a, domainFile(t))
	if _, err := s.p.OpenTGT(s.d, 0x777); !isErrno(err, syscall.EINVAL) {
		t.Fatalf("unknown: %v", err)
	}
	_, iniQPN, err := s.p.CreateINI()
	ok(t, err)
	if _, err := s.p.OpenTGT(s.d, iniQPN); !isErrno(err, syscall.EINVAL) {
		t.Fatalf("INI opened as TGT: %v", err)
	}
}

// Rule: freed numbers are reused at once; open of an old number then finds
// the WRONG QP, which only a query (dest QPN, address) can tell.
func TestModelQPNReuseOpensWrongQP(t *testing.T) {
	for _, reuse := range []Reuse{ReuseLIFO, ReuseLowest} {
		_, a, b := twoNodes(t, reuse)
		path := domainFile(t)
		sa, sb := newSide(t, a, domainFile(t)), newSide(t, b, path)
		l := listen(t, sb.p, kernel.ExchangeXRC)
		k1 := physLink(t, sa, sb, l)
		teardown(t, sa, sb, k1)
		ok(t, sb.p.DestroyQP(k1.tgt)) // the TGT dies ...
		k2 := physLink(t, sa, sb, l)  // ... and the next one gets its number
		if k2.tgtQPN != k1.tgtQPN {
			t.Fatalf("%v: number not reused: %#x then %#x", reuse, k1.tgtQPN, k2.tgtQPN)
		}
		// A late joiner that still believes in k1 opens k2's TGT.
		other := newSide(t, b, path)
		h := must[kernel.QP](t)(other.p.OpenTGT(other.d, k1.tgtQPN))
		info := must[kernel.QPInfo](t)(other.p.QueryQP(h))
		if info.DestQPN != k2.iniQPN || k1.iniQPN == k2.iniQPN {
			t.Fatalf("%v: opened %+v", reuse, info)
		}
	}
	// SRQ numbers are reused too.
	_, a, _ := twoNodes(t, ReuseLIFO)
	s := newSide(t, a, domainFile(t))
	old := s.srqn
	ok(t, s.p.DestroySRQ(s.srq))
	_, n, err := s.p.CreateSRQ(s.d, testSlot)
	ok(t, err)
	if n != old {
		t.Fatalf("SRQN not reused: %#x then %#x", old, n)
	}
	// ReuseNever gives fresh numbers.
	_, c, _ := twoNodes(t, ReuseNever)
	p := c.NewProcess()
	q1, n1, _ := p.CreateINI()
	p.DestroyQP(q1)
	_, n2, _ := p.CreateINI()
	if n1 == n2 {
		t.Fatal("ReuseNever reused")
	}
}

// Rule: delivery goes through any TGT into ANY SRQ of the TGT's domain named
// by the sender, and the completion says which TGT.
func TestModelDeliveryAnySRQOfDomain(t *testing.T) {
	_, a, b := twoNodes(t, ReuseLIFO)
	path := domainFile(t)
	sa := newSide(t, a, domainFile(t))
	sb1, sb2 := newSide(t, b, path), newSide(t, b, path)
	l := listen(t, sb1.p, kernel.ExchangeXRC)
	k := physLink(t, sa, sb1, l) // TGT created by sb1
	if c := send(t, sa.p, k.ini, sb2.srqn, 42, "to sb2"); c.Status != verbs.WCSuccess {
		t.Fatalf("send: %v", c.Status)
	}
	r := recv(t, sb2)
	if r.TGTQPN != k.tgtQPN || r.Imm != 42 || string(r.Payload) != "to sb2" {
		t.Fatalf("received %+v", r)
	}
	send(t, sa.p, k.ini, sb1.srqn, 43, "to sb1")
	if r := recv(t, sb1); r.Imm != 43 {
		t.Fatalf("received %+v", r)
	}
	// An SRQ of another domain on that node is not reachable.
	other := newSide(t, b, domainFile(t))
	if c := send(t, sa.p, k.ini, other.srqn, 1, "x"); c.Status != verbs.WCRemInvReqErr {
		t.Fatalf("foreign-domain SRQ: %v", c.Status)
	}
}

// Rule: a send to a missing SRQN completes in error, the INI goes to ERR and
// everything behind it is flushed, later posts too.
func TestModelSendToMissingSRQNErrorsINI(t *testing.T) {
	_, a, b := twoNodes(t, ReuseNever)
	sa, sb := newSide(t, a, domainFile(t)), newSide(t, b, domainFile(t))
	k := physLink(t, sa, sb, listen(t, sb.p, kernel.ExchangeXRC))
	ok(t, sa.p.PostSend(k.ini, []kernel.SendWR{
		{WRID: 1, RemoteSRQN: sb.srqn}, {WRID: 2, RemoteSRQN: 0xFFFF}, {WRID: 3, RemoteSRQN: sb.srqn},
	}))
	var c [4]kernel.SendCompletion
	n := must[int](t)(sa.p.PollSend(ctxT(t), k.ini, c[:]))
	want := []verbs.WCStatus{verbs.WCSuccess, verbs.WCRemInvReqErr, verbs.WCWRFlushErr}
	if n != 3 {
		t.Fatalf("%d completions", n)
	}
	for i, w := range want {
		if c[i].Status != w || c[i].WRID != uint64(i+1) {
			t.Fatalf("completion %d: %+v, want %v", i, c[i], w)
		}
	}
	if info, _ := sa.p.QueryQP(k.ini); info.State != verbs.QPStateErr {
		t.Fatalf("INI state %v", info.State)
	}
	if c := send(t, sa.p, k.ini, sb.srqn, 0, ""); c.Status != verbs.WCWRFlushErr {
		t.Fatalf("post after error: %v", c.Status)
	}
	recv(t, sb) // only the first arrived
	var r [1]kernel.RecvCompletion
	ctx, cancel := contextShort()
	defer cancel()
	if _, err := sb.p.PollRecv(ctx, sb.srq, r[:]); err == nil {
		t.Fatal("flushed message delivered")
	}
}

// Rule: an INI sends only in RTS; a TGT receives only in RTR or later.
func TestModelStatesGateTraffic(t *testing.T) {
	_, a, b := twoNodes(t, ReuseNever)
	sa, sb := newSide(t, a, domainFile(t)), newSide(t, b, domainFile(t))
	l := listen(t, sb.p, kernel.ExchangeXRC)
	ini, iniQPN, _ := sa.p.CreateINI()
	if err := sa.p.PostSend(ini, []kernel.SendWR{{RemoteSRQN: sb.srqn}}); !isErrno(err, syscall.EINVAL) {
		t.Fatalf("post in RESET: %v", err)
	}
	aid := must[kernel.ID](t)(sa.p.Connect(ctxT(t), addrPort(addrB), kernel.ExchangeXRC, iniQPN, nil))
	pid := event(t, sb.p, l, kernel.EventConnectRequest).ID
	tgt, tgtQPN, _ := sb.p.CreateTGT(sb.d)
	ok(t, sb.p.TransitionQP(tgt, verbs.QPStateInit, pid)) // INIT: not ready to receive
	ok(t, sb.p.Accept(pid, tgtQPN, nil))
	event(t, sa.p, aid, kernel.EventConnectResponse)
	ok(t, sa.p.TransitionQP(ini, verbs.QPStateRTR, aid))
	if err := sa.p.PostSend(ini, []kernel.SendWR{{RemoteSRQN: sb.srqn}}); !isErrno(err, syscall.EINVAL) {
		t.Fatalf("post in RTR: %v", err)
	}
	ok(t, sa.p.TransitionQP(ini, verbs.QPStateRTS, aid))
	if c := send(t, sa.p, ini, sb.srqn, 0, ""); c.Status != verbs.WCRetryExcErr {
		t.Fatalf("send to a TGT in INIT: %v", c.Status)
	}
	// RTR without a CM id that knows the path is refused.
	t2, _, _ := sb.p.CreateTGT(sb.d)
	if err := sb.p.TransitionQP(t2, verbs.QPStateRTR, 0); !isErrno(err, syscall.EINVAL) {
		t.Fatalf("RTR without an id: %v", err)
	}
	// Backwards is refused.
	if err := sa.p.TransitionQP(ini, verbs.QPStateInit, aid); !isErrno(err, syscall.EINVAL) {
		t.Fatalf("ERR->INIT: %v", err)
	}
}

// Rule: QP counts per node are observable: objects, not handles.
func TestModelQPCounts(t *testing.T) {
	_, a, b := twoNodes(t, ReuseNever)
	path := domainFile(t)
	sa := newSide(t, a, domainFile(t))
	sb1, sb2 := newSide(t, b, path), newSide(t, b, path)
	k := physLink(t, sa, sb1, listen(t, sb1.p, kernel.ExchangeXRC))
	must[kernel.QP](t)(sb2.p.OpenTGT(sb2.d, k.tgtQPN))
	if ini, tgt := a.QPCount(); ini != 1 || tgt != 0 {
		t.Fatalf("A: %d INI %d TGT", ini, tgt)
	}
	if ini, tgt := b.QPCount(); ini != 0 || tgt != 1 {
		t.Fatalf("B: %d INI %d TGT", ini, tgt)
	}
}

// Rule: process death closes every handle at once: TGT handles drop (the TGT
// lives for other holders), SRQs and domains go, CM ids send what the kernel
// sends.
func TestModelProcessDeathClosesAll(t *testing.T) {
	_, a, b := twoNodes(t, ReuseNever)
	path := domainFile(t)
	sa := newSide(t, a, domainFile(t))
	sb1, sb2 := newSide(t, b, path), newSide(t, b, path)
	l := listen(t, sb1.p, kernel.ExchangeXRC)
	k := physLink(t, sa, sb1, l)
	h2 := must[kernel.QP](t)(sb2.p.OpenTGT(sb2.d, k.tgtQPN))
	// The TGT creator (and holder of the TGT-typed CM id) dies: no DREQ for
	// its XRC_RECV id, and the TGT lives on for sb2.
	sb1.p.Kill()
	if sb1.p.Handles() != 0 {
		t.Fatalf("%d handles survive", sb1.p.Handles())
	}
	noEvent(t, sa.p, k.aid)
	if b.TGTHandles(k.tgtQPN) != 1 {
		t.Fatalf("use count %d", b.TGTHandles(k.tgtQPN))
	}
	if c := send(t, sa.p, k.ini, sb2.srqn, 7, "still"); c.Status != verbs.WCSuccess {
		t.Fatalf("send after creator death: %v", c.Status)
	}
	recv(t, sb2)
	if _, _, err := sb1.p.CreateINI(); !errors.Is(err, verbs.ErrClosed) {
		t.Fatalf("dead process: %v", err)
	}
	// The sender dies: its INI-side id sends a DREQ... to nobody here (the
	// passive id is gone), and its INI disappears.
	sa.p.Kill()
	if ini, _ := a.QPCount(); ini != 0 {
		t.Fatal("INI survived its process")
	}
	// The last holder dies: TGT, SRQ and domain go.
	_ = h2
	sb2.p.Kill()
	if _, tgt := b.QPCount(); tgt != 0 || b.XRCDs() != 0 {
		t.Fatalf("TGT %d, domains %d after all died", tgt, b.XRCDs())
	}
	if b.StaleEntries() != 0 || a.StaleEntries() != 0 {
		t.Fatal("stale entries survive dead ids")
	}
}

// Rule: death wakes every waiter of the process.
func TestModelDeathWakesWaiters(t *testing.T) {
	_, a, _ := twoNodes(t, ReuseNever)
	s := newSide(t, a, domainFile(t))
	done := make(chan error)
	go func() {
		var r [1]kernel.RecvCompletion
		_, err := s.p.PollRecv(ctxT(t), s.srq, r[:])
		done <- err
	}()
	// The poller must be waiting, not arrive after the death (a dead
	// process's lookup fails on its own): nothing comes for 50 ms.
	select {
	case err := <-done:
		t.Fatalf("the poller returned before the death: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	s.p.Kill()
	if err := <-done; !errors.Is(err, verbs.ErrClosed) {
		t.Fatalf("waiter got %v", err)
	}
}

func TestModelPollHonoursContext(t *testing.T) {
	_, a, _ := twoNodes(t, ReuseNever)
	s := newSide(t, a, domainFile(t))
	ctx, cancel := contextShort()
	defer cancel()
	var r [1]kernel.RecvCompletion
	if _, err := s.p.PollRecv(ctx, s.srq, r[:]); !errors.Is(err, ctx.Err()) || err == nil {
		t.Fatalf("%v", err)
	}

}

// Rule: a send queue holds max_send_wr sends until their completions are
// polled; a post beyond that fails with ENOMEM, posts the rest of its chain
// not at all, and leaves the QP as it is (mlx5_wq_overflow).
func TestModelSendQueueFullENOMEM(t *testing.T) {
	f := NewFabric(ReuseLIFO)
	a := f.AddNode(addrA, NodeConfig{SendQueueDepth: 3})
	b := f.AddNode(addrB, NodeConfig{})
	sa, sb := newSide(t, a, domainFile(t)), newSide(t, b, domainFile(t))
	k := physLink(t, sa, sb, listen(t, sb.p, kernel.ExchangeXRC))
	wr := func(id uint64) kernel.SendWR {
		return kernel.SendWR{WRID: id, RemoteSRQN: sb.srqn, Imm: uint32(id), Payload: []byte{byte(id)}}
	}
	ok(t, sa.p.PostSend(k.ini, []kernel.SendWR{wr(1), wr(2)}))
	err := sa.p.PostSend(k.ini, []kernel.SendWR{wr(3), wr(4), wr(5)})
	if !isErrno(err, syscall.ENOMEM) {
		t.Fatalf("post past the depth: %v, want ENOMEM", err)
	}
	if info := must[kernel.QPInfo](t)(sa.p.QueryQP(k.ini)); info.State != verbs.QPStateRTS {
		t.Fatalf("INI in %v after ENOMEM, want RTS", info.State)
	}
	var c [8]kernel.SendCompletion
	n := must[int](t)(sa.p.PollSend(ctxT(t), k.ini, c[:]))
	if n != 3 || c[2].WRID != 3 || c[2].Status != verbs.WCSuccess {
		t.Fatalf("completions %+v, want 1-3 successful (4 and 5 never posted)", c[:n])
	}
	ok(t, sa.p.PostSend(k.ini, []kernel.SendWR{wr(6)})) // polled slots are free again
	for _, want := range []uint32{1, 2, 3, 6} {
		if r := recv(t, sb); r.Imm != want {
			t.Fatalf("received imm %d, want %d", r.Imm, want)
		}
	}
}

// Rule: an SRQ's receives hold its slot size; a longer message completes
// that receive with a local length error and NAKs the sender: the send
// completes with WCRemInvReqErr and the INI goes to ERR, flushing what
// follows, and so does the TGT, which delivers nothing more. A message of
// exactly the slot size is delivered.
func TestModelMessageLongerThanSlot(t *testing.T) {
	_, a, b := twoNodes(t, ReuseLIFO)
	sa, sb := newSide(t, a, domainFile(t)), newSide(t, b, domainFile(t))
	k := physLink(t, sa, sb, listen(t, sb.p, kernel.ExchangeXRC))
	fits := string(make([]byte, testSlot))
	if c := send(t, sa.p, k.ini, sb.srqn, 1, fits); c.Status != verbs.WCSuccess {
		t.Fatalf("a message of the slot size: %v", c.Status)
	}
	if r := recv(t, sb); r.Status != verbs.WCSuccess || len(r.Payload) != testSlot {
		t.Fatalf("received %v, %d bytes", r.Status, len(r.Payload))
	}
	if c := send(t, sa.p, k.ini, sb.srqn, 2, fits+"x"); c.Status != verbs.WCRemInvReqErr {
		t.Fatalf("one byte over the slot: %v, want WCRemInvReqErr", c.Status)
	}
	if r := recv(t, sb); r.Status != verbs.WCLocLenErr || r.Imm != 0 || len(r.Payload) != 0 {
		t.Fatalf("the receive it took: %+v, want WCLocLenErr with no payload and no immediate data", r)
	}
	if info := must[kernel.QPInfo](t)(sa.p.QueryQP(k.ini)); info.State != verbs.QPStateErr {
		t.Fatalf("INI in %v, want ERR", info.State)
	}
	if info := must[kernel.QPInfo](t)(sb.p.QueryQP(k.tgt)); info.State != verbs.QPStateErr {
		t.Fatalf("TGT in %v, want ERR", info.State)
	}
}

// Rule: every move up takes its attributes from a connected-mode CM id, as
// the real seam's rdma_init_qp_attr does (INIT's port, P_Key index and
// access flags too), and RTS needs the exchange still live. The model let
// INIT, and RTS from RTR, go without an id (or through a SIDR one), which
// the device refuses.
func TestModelMovesUpNeedACMID(t *testing.T) {
	_, a, b := twoNodes(t, ReuseNever)
	sa, sb := newSide(t, a, domainFile(t)), newSide(t, b, domainFile(t))
	ini, iniQPN, err := sa.p.CreateINI()
	ok(t, err)
	if err := sa.p.TransitionQP(ini, verbs.QPStateInit, 0); !isErrno(err, syscall.EINVAL) {
		t.Fatalf("INIT without an id: %v, want EINVAL", err)
	}
	listen(t, sb.p, kernel.ExchangeSIDR)
	sidr := must[kernel.ID](t)(sa.p.Connect(ctxT(t), addrPort(addrB), kernel.ExchangeSIDR, 0, nil))
	if err := sa.p.TransitionQP(ini, verbs.QPStateInit, sidr); !isErrno(err, syscall.EINVAL) {
		t.Fatalf("INIT through a SIDR id: %v, want EINVAL", err)
	}
	ok(t, sa.p.TransitionQP(ini, verbs.QPStateReset, 0)) // to RESET needs none
	l := listen(t, sb.p, kernel.ExchangeXRC)
	aid := must[kernel.ID](t)(sa.p.Connect(ctxT(t), addrPort(addrB), kernel.ExchangeXRC, iniQPN, nil))
	pid := event(t, sb.p, l, kernel.EventConnectRequest).ID
	_, tgtQPN, _ := sb.p.CreateTGT(sb.d)
	ok(t, sb.p.Accept(pid, tgtQPN, nil))
	event(t, sa.p, aid, kernel.EventConnectResponse)
	ok(t, sa.p.TransitionQP(ini, verbs.QPStateRTR, aid))
	if err := sa.p.TransitionQP(ini, verbs.QPStateRTS, 0); !isErrno(err, syscall.EINVAL) {
		t.Fatalf("RTR->RTS without an id: %v, want EINVAL", err)
	}
	ok(t, sa.p.TransitionQP(ini, verbs.QPStateRTR, 0)) // where it is already: nothing to do
	ok(t, sa.p.TransitionQP(ini, verbs.QPStateRTS, aid))
}

// Rule (NodeConfig.SRQReceives): a message that finds no receive posted on
// its SRQ is NAKed RNR and retried for ever (rnr_retry 7): it waits at the
// INI, with every later send of that INI behind it, also those for another
// SRQ with receives to spare, and completes once the receiver's poll has
// posted a receive again. Waiting sends hold send queue slots.
func TestModelRNRWaitsForReceive(t *testing.T) {
	f := NewFabric(ReuseLIFO)
	a := f.AddNode(addrA, NodeConfig{SendQueueDepth: 6})
	b := f.AddNode(addrB, NodeConfig{SRQReceives: 2})
	sa, sb := newSide(t, a, domainFile(t)), newSide(t, b, domainFile(t))
	other, otherN, err := sb.p.CreateSRQ(sb.d, testSlot)
	ok(t, err)
	k := physLink(t, sa, sb, listen(t, sb.p, kernel.ExchangeXRC))
	wr := func(id uint64, srqn uint32) kernel.SendWR {
		return kernel.SendWR{WRID: id, RemoteSRQN: srqn, Imm: uint32(id), Payload: []byte{byte(id)}}
	}
	ok(t, sa.p.PostSend(k.ini, []kernel.SendWR{wr(1, sb.srqn), wr(2, sb.srqn), wr(3, sb.srqn), wr(4, otherN)}))
	var c [8]kernel.SendCompletion
	if n := must[int](t)(sa.p.PollSend(ctxT(t), k.ini, c[:])); n != 2 || c[0].WRID != 1 || c[1].WRID != 2 {
		t.Fatalf("completions %+v, want 1 and 2 only (3 finds no receive, 4 waits behind it)", c[:n])
	}
	ctx, cancel := contextShort()
	defer cancel()
	if n, err := sb.p.PollRecv(ctx, other, make([]kernel.RecvCompletion, 1)); err == nil {
		t.Fatalf("the other SRQ got %d messages past the one waiting", n)
	}
	// 3 and 4 hold two of the six slots (1's and 2's are polled).
	ok(t, sa.p.PostSend(k.ini, []kernel.SendWR{wr(5, sb.srqn), wr(6, sb.srqn), wr(7, sb.srqn), wr(8, sb.srqn)}))
	if err := sa.p.PostSend(k.ini, []kernel.SendWR{wr(9, sb.srqn)}); !isErrno(err, syscall.ENOMEM) {
		t.Fatalf("post past the depth with sends waiting: %v, want ENOMEM", err)
	}
	// Each receive polled takes one more waiting send in.
	for _, want := range []uint32{1, 2, 3, 5, 6, 7, 8} {
		if r := recv(t, sb); r.Imm != want || r.Status != verbs.WCSuccess {
			t.Fatalf("received %+v, want imm %d", r, want)
		}
	}
	if r := must[int](t)(sb.p.PollRecv(ctxT(t), other, make([]kernel.RecvCompletion, 1))); r != 1 {
		t.Fatalf("the other SRQ: %d messages", r)
	}
	var got []uint64
	for len(got) < 6 {
		n := must[int](t)(sa.p.PollSend(ctxT(t), k.ini, c[:]))
		for _, x := range c[:n] {
			if x.Status != verbs.WCSuccess {
				t.Fatalf("completion %+v", x)
			}
			got = append(got, x.WRID)
		}
	}
	if fmt.Sprint(got) != "[3 4 5 6 7 8]" {
		t.Fatalf("completions in order %v, want [3 4 5 6 7 8]", got)
	}
}

// Rule: sends waiting for a receive end as posted sends do: an INI moved to
// ERR flushes them in order; a receiver that dies takes its SRQ and TGT,
// and the first waiting send then fails with the transport's retries
// exhausted, the INI in ERR and the rest flushed.
func TestModelRNRWaitingSendsEnd(t *testing.T) {
	for _, c := range []struct {
		name  string
		end   func(sa, sb *side, k link)
		first verbs.WCStatus
	}{
		{"INI to ERR", func(sa, _ *side, k link) { ok(t, sa.p.TransitionQP(k.ini, verbs.QPStateErr, 0)) }, verbs.WCWRFlushErr},
		{"receiver dies", func(_, sb *side, _ link) { sb.p.Kill() }, verbs.WCRetryExcErr},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := NewFabric(ReuseLIFO)
			a := f.AddNode(addrA, NodeConfig{})
			b := f.AddNode(addrB, NodeConfig{SRQReceives: 1})
			sa, sb := newSide(t, a, domainFile(t)), newSide(t, b, domainFile(t))
			k := physLink(t, sa, sb, listen(t, sb.p, kernel.ExchangeXRC))
			var wrs []kernel.SendWR
			for id := range uint64(4) {
				wrs = append(wrs, kernel.SendWR{WRID: id, RemoteSRQN: sb.srqn, Payload: []byte{1}})
			}
			ok(t, sa.p.PostSend(k.ini, wrs))
			var cs [8]kernel.SendCompletion
			if n := must[int](t)(sa.p.PollSend(ctxT(t), k.ini, cs[:])); n != 1 || cs[0].Status != verbs.WCSuccess {
				t.Fatalf("completions %+v, want the first only", cs[:n])
			}
			c.end(sa, sb, k)
			n := must[int](t)(sa.p.PollSend(ctxT(t), k.ini, cs[:]))
			want := []verbs.WCStatus{c.first, verbs.WCWRFlushErr, verbs.WCWRFlushErr}
			if n != 3 {
				t.Fatalf("completions %+v, want 3", cs[:n])
			}
			for i, x := range cs[:n] {
				if x.WRID != uint64(i+1) || x.Status != want[i] {
					t.Fatalf("completion %d: %+v, want WRID %d %v", i, x, i+1, want[i])
				}
			}
			if info := must[kernel.QPInfo](t)(sa.p.QueryQP(k.ini)); info.State != verbs.QPStateErr {
				t.Fatalf("INI in %v, want ERR", info.State)
			}
		})
	}
}

// A failed device (Node.FailDevice): every process on the node, and one
// started later, sees DeviceFatal closed; creating anything fails with EIO;
// what exists can still be destroyed; a process on another node sees
// nothing.
func TestModelFailDevice(t *testing.T) {
	_, a, b := twoNodes(t, ReuseLIFO)
	pa, pb := a.NewProcess(), b.NewProcess()
	defer pb.Close()
	x := must[kernel.XRCD](t)(pa.OpenXRCD(domainFile(t), kernel.XRCDCreate))
	ini, _, err := pa.CreateINI()
	ok(t, err)
	a.FailDevice()
	a.FailDevice() // idempotent
	for name, p := range map[string]*Process{"running": pa, "started after": a.NewProcess()} {
		select {
		case <-p.DeviceFatal():
		default:
			t.Fatalf("%s process: DeviceFatal not closed", name)
		}
	}
	select {
	case <-pb.DeviceFatal():
		t.Fatal("a process on another node sees the device fail")
	default:
	}
	if _, _, err := pa.CreateINI(); !isErrno(err, syscall.EIO) {
		t.Fatalf("CreateINI: %v, want EIO", err)
	}
	if _, _, err := pa.CreateTGT(x); !isErrno(err, syscall.EIO) {
		t.Fatalf("CreateTGT: %v, want EIO", err)
	}
	if _, _, err := pa.CreateSRQ(x, testSlot); !isErrno(err, syscall.EIO) {
		t.Fatalf("CreateSRQ: %v, want EIO", err)
	}
	if _, err := pa.OpenXRCD("", kernel.XRCDCreate); !isErrno(err, syscall.EIO) {
		t.Fatalf("OpenXRCD: %v, want EIO", err)
	}
	ok(t, pa.DestroyQP(ini))
	ok(t, pa.CloseXRCD(x))
	if n := pa.Handles(); n != 0 {
		t.Fatalf("%d handles left after destroying everything", n)
	}
}
