package xrc

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/verbs"
	"github.com/goxrc/goxrc/xrc/internal/wire"
)

// physLeg makes a PHYS leg from raw peer p to r by hand (INI, REQ, RTS,
// RTU) and returns the INI and the ACCEPT.
func physLeg(t *testing.T, p *rawPeer, to netip.AddrPort, tag uint32, flags wire.Flags) (kernel.QP, wire.Accept) {
	t.Helper()
	ini, _, _, acc := physLink(t, p, to, tag, flags)
	return ini, acc
}

// physLink is physLeg keeping the CM id (its Disconnect is the DREQ) and
// the INI's number.
func physLink(t *testing.T, p *rawPeer, to netip.AddrPort, tag uint32, flags wire.Flags) (kernel.QP, uint32, kernel.ID, wire.Accept) {
	t.Helper()
	k := p.k
	ini, iniQPN, err := k.CreateINI()
	if err != nil {
		t.Fatal(err)
	}
	req := wire.Req{Type: wire.TypePhysReq, Flags: flags, ConnTag: tag, Incarnation: p.inc, INIQPN: iniQPN,
		SRQN: p.srqn, ReplyPort: p.addr.Port(), Credits: 8, MaxMessage: MaxMessageSize}
	if flags&wire.FlagMove != 0 {
		req.Move = 1 // each test moves a leg once
	}
	b := encodeReq(t, req)
	id, err := k.Connect(ctxT(t, time.Second), to, kernel.ExchangeXRC, iniQPN, b)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := k.Event(ctxT(t, time.Second), id)
	var acc wire.Accept
	if err != nil || ev.Type != kernel.EventConnectResponse || wire.DecodeAccept(ev.PrivateData, &acc) != nil {
		t.Fatalf("PHYS_REQ tag %d: %v %v", tag, ev.Type, err)
	}
	if err := k.TransitionQP(ini, verbs.QPStateRTS, id); err != nil {
		t.Fatal(err)
	}
	if err := k.Establish(id); err != nil {
		t.Fatal(err)
	}
	if flags&wire.FlagMove == 0 {
		sendFirstFrame(t, p, ini, acc)
	}
	return ini, iniQPN, id, acc
}

// sendFirstFrame sends, as a dialer does once its leg is bound, the
// keepalive that completes the acceptor's half of a new leg (protocol
// version 4: until it comes, Accept does not return the connection).
func sendFirstFrame(t *testing.T, p *rawPeer, ini kernel.QP, acc wire.Accept) {
	t.Helper()
	if err := p.k.PostSend(ini, []kernel.SendWR{{WRID: 1<<40 | uint64(acc.AcceptorTag), RemoteSRQN: acc.SRQN, Imm: acc.AcceptorTag, Payload: keepaliveFrame}}); err != nil {
		t.Fatalf("first frame: %v", err)
	}
}

// TestMovedLegRefusesReusedTGT: a leg that MOVEd kept the numbers of the
// TGTs it left (acceptedLeg.prev) for ever, and LegAccepts took any message
// that came through a TGT of that number. Once the old TGT is gone (its last
// handle was the leg's) the number is free at once (facts.md), and a TGT
// made next for another sender gets it: that sender, naming the moved leg's
// tag, injected data into a connection not its own. Now a leg takes
// messages through a TGT it left only until the SRQ's next drain, and never
// through one we hold for another sender.
func TestMovedLegRefusesReusedTGT(t *testing.T) {
	w := newWorld(t)
	r := w.endpoint("10.0.50.2", 7001)
	a := w.rawPeer("10.0.50.1", 7100)
	b := w.rawPeer("10.0.50.3", 7100)
	// (b shares rawPeer's incarnation; its legs use other tags)

	_, acc1 := physLeg(t, a, r.Addr(), 1, 0)
	ca, err := r.Accept(ctxT(t, 2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	// A recovers: a new INI, the leg MOVEd by PHYS onto a new TGT. The old
	// TGT's only handle was r's: it dies and frees its number.
	iniA2, accM := physLeg(t, a, r.Addr(), 1, wire.FlagMove)
	if accM.TGTQPN == acc1.TGTQPN || accM.AcceptorTag != acc1.AcceptorTag {
		t.Fatalf("move: %+v after %+v", accM, acc1)
	}
	eventually(t, "old TGT gone", func() (bool, string) {
		n := r.acc.LocalCount(acc1.TGTQPN)
		st := w.f.Node("10.0.50.2").Stats()
		return n == 0 && st.TGTs == 1, fmt.Sprint(n, st)
	})
	// A's own data on the moved leg arrives.
	if err := a.k.PostSend(iniA2, []kernel.SendWR{{WRID: 1, RemoteSRQN: accM.SRQN, Imm: accM.AcceptorTag, Payload: []byte("D\x00\x00\x00\x00from A")}}); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if n, err := ca.Recv(ctxT(t, time.Second), buf); err != nil || string(buf[:n]) != "from A" {
		t.Fatalf("A's message: %q %v", buf[:n], err)
	}
	// B, another sender, gets a TGT of its own at r: the freed number.
	iniB, accB := physLeg(t, b, r.Addr(), 2, 0)
	if accB.TGTQPN != acc1.TGTQPN {
		t.Fatalf("setup: B's TGT %#x did not reuse A's old %#x", accB.TGTQPN, acc1.TGTQPN)
	}
	cb, err := r.Accept(ctxT(t, 2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	_ = cb
	dropped := r.Stats().Dropped
	// B names A's tag.
	if err := b.k.PostSend(iniB, []kernel.SendWR{{WRID: 1, RemoteSRQN: accB.SRQN, Imm: acc1.AcceptorTag, Payload: []byte("D\x00\x00\x00\x01injected by B")}}); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if n, err := ca.Recv(short, buf); err == nil {
		t.Fatalf("A's connection received %q from sender B (through a TGT that only shares the number of one A left)", buf[:n])
	}
	if got := r.Stats().Dropped; got != dropped+1 {
		t.Fatalf("dropped %d, want %d", got, dropped+1)
	}
}

// failH fails the next single-frame keepalive post once armed, as a post
// on an INI that just failed does: the uplink goes RECOVERING.
type failH struct {
	kernel.Kernel
	armed atomic.Bool
}

func (k *failH) PostSend(q kernel.QP, wrs []kernel.SendWR) error {
	if len(wrs) == 1 && len(wrs[0].Payload) == 1 && wrs[0].Payload[0] == kindHeartbeat && k.armed.CompareAndSwap(true, false) {
		return syscall.EIO
	}
	return k.Kernel.PostSend(q, wrs)
}

// TestOneExchangeFirstFrameDuringRecovery: a one-exchange dial whose first frame
// (the keepalive that completes the acceptor's half) found the uplink
// RECOVERING gave up on it at once (postFirstFrame spun its 16 tries on
// postFailed without waiting) and Dial returned success. An application that
// then closed without sending made its FIN the first frame: the acceptor
// took the dial for abandoned, and Accept never returned a connection that
// Dial returned.
func TestOneExchangeFirstFrameDuringRecovery(t *testing.T) {
	w := newWorld(t)
	slow := func(c *Config) { c.Heartbeat, c.IdleTimeout = 5*time.Second, 30*time.Second } // no janitor keepalive in the test
	var fk *failH
	a := w.wrappedEndpoint("10.0.51.1", 7000, func(k kernel.Kernel) kernel.Kernel { fk = &failH{Kernel: k}; return fk }, slow)
	b := w.endpoint("10.0.51.2", 7000, slow)
	pair(t, a, b) // uplinks both ways: the next dial takes one exchange
	dialClosingAtOnce(t, a, b, &fk.armed)
}

// dialClosingAtOnce arms the first frame's failure, dials b from a and
// closes at once without sending: Accept must still return the connection
// Dial returned.
func dialClosingAtOnce(t *testing.T, a, b *proc, armed *atomic.Bool) {
	t.Helper()
	armed.Store(true)
	acc := make(chan error, 1)
	go func() {
		_, err := b.Accept(ctxT(t, 3*time.Second))
		acc <- err
	}()
	c, err := a.Dial(ctxT(t, 5*time.Second), b.Addr().String())
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	if armed.Load() {
		t.Fatal("the first frame's post was never tried")
	}
	c.Close()
	if err := <-acc; err != nil {
		t.Fatalf("Dial returned a connection, Accept never did: %v (b: abandoned %d)", err, b.Stats().Abandoned)
	}
}

// Variant: the injected frame carried a number far ahead; A's own later
// messages were then taken for duplicates and silently dropped.
func TestMovedLegReusedTGTCannotSilenceOwner(t *testing.T) {
	w := newWorld(t)
	r := w.endpoint("10.0.52.2", 7001)
	a := w.rawPeer("10.0.52.1", 7100)
	b := w.rawPeer("10.0.52.3", 7100)
	_, acc1 := physLeg(t, a, r.Addr(), 1, 0)
	ca, err := r.Accept(ctxT(t, 2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	iniA2, accM := physLeg(t, a, r.Addr(), 1, wire.FlagMove)
	// r keeps the old TGT until its SRQ drains (a message A sent through
	// it may still be queued): only then is its number free.
	eventually(t, "old TGT gone", func() (bool, string) {
		st := w.f.Node("10.0.52.2").Stats()
		return st.TGTs == 1, fmt.Sprint(st)
	})
	iniB, accB := physLeg(t, b, r.Addr(), 2, 0)
	if accB.TGTQPN != acc1.TGTQPN {
		t.Fatalf("setup: the model did not reuse the old TGT number (%#x, got %#x)", acc1.TGTQPN, accB.TGTQPN)
	}
	if _, err := r.Accept(ctxT(t, 2*time.Second)); err != nil {
		t.Fatal(err)
	}
	b.k.PostSend(iniB, []kernel.SendWR{{WRID: 1, RemoteSRQN: accB.SRQN, Imm: acc1.AcceptorTag, Payload: []byte("D\x7f\xff\x00\x00")}})
	time.Sleep(50 * time.Millisecond)
	dups := r.Stats().Duplicates
	a.k.PostSend(iniA2, []kernel.SendWR{{WRID: 1, RemoteSRQN: accM.SRQN, Imm: accM.AcceptorTag, Payload: []byte("D\x00\x00\x00\x00from A")}})
	buf := make([]byte, 64)
	n, err := ca.Recv(ctxT(t, 2*time.Second), buf)
	if err != nil || string(buf[:n]) != "from A" {
		t.Fatalf("A's own message 0 after B's injected number 0x7fff0000: %q, %v (duplicates %d before, %d now)",
			buf[:n], err, dups, r.Stats().Duplicates)
	}
}

// holdRecv holds the receive loop's polls while armed, as a receiver whose
// receive loop is slow (a loaded machine) does: messages wait in the SRQ. A
// held poll is one that has not begun: a deadline passing meanwhile does
// not end it without a look at the SRQ (kernel.Kernel's PollRecv contract;
// the receive loop takes such a poll's error for an empty SRQ). Cancelled
// (a kick, or Close), it returns.
type holdRecv struct {
	kernel.Kernel
	armed   atomic.Bool
	held    chan struct{} // a poll is held
	release chan struct{}
	polling atomic.Bool // a poll is under way in the kernel, not held
}

func (k *holdRecv) PollRecv(ctx context.Context, s kernel.SRQ, out []kernel.RecvCompletion) (int, error) {
	if !k.armed.Load() {
		k.polling.Store(true)
		defer k.polling.Store(false)
		return k.Kernel.PollRecv(ctx, s, out)
	}
	select {
	case k.held <- struct{}{}:
	default:
	}
	select {
	case <-k.release:
	case <-ctx.Done():
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return 0, ctx.Err()
		}
		select { // begins once released, and looks then
		case <-k.release:
		case <-time.After(10 * time.Second):
		}
	}
	return k.Kernel.PollRecv(ctx, s, out)
}

// TestMovedLegTakesQueuedMessageDespiteReusedNumber: a message its sender
// posted through a leg's TGT, completed (never to be sent again) and still
// queued in the receiver's SRQ when the sender's recovery MOVEd the leg, was
// dropped. The MOVE released the receiver's last handle on the old TGT, the
// kernel gave its number at once to a TGT made for another sender, and a
// leg refuses what comes through the number it left once we hold a TGT of
// that number for another sender. The connection lost the message without
// an error, and its sender's keepalives kept it alive
// (TestEndpointManyDialsKilledThreeNodes, about one run in 300: the data and
// the half FIN of one-exchange connections whose dialer's uplink recovered
// right after the dial). Now the receiver keeps its handle on a TGT a leg
// moved away from until its SRQ has drained, so the number is not given
// again while such a message may be queued.
func TestMovedLegTakesQueuedMessageDespiteReusedNumber(t *testing.T) {
	w := newWorld(t)
	hk := &holdRecv{held: make(chan struct{}, 1), release: make(chan struct{})}
	r := w.wrappedEndpoint("10.0.53.2", 7001, func(k kernel.Kernel) kernel.Kernel { hk.Kernel = k; return hk })
	a := w.rawPeer("10.0.53.1", 7100)
	b := w.rawPeer("10.0.53.3", 7100)
	ini1, acc1 := physLeg(t, a, r.Addr(), 1, 0)
	ca, err := r.Accept(ctxT(t, 2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	post := func(ini kernel.QP, acc wire.Accept, wrid uint64, frame string) {
		t.Helper()
		if err := a.k.PostSend(ini, []kernel.SendWR{{WRID: wrid, RemoteSRQN: acc.SRQN, Imm: acc.AcceptorTag, Payload: []byte(frame)}}); err != nil {
			t.Fatal(err)
		}
	}
	recv := func(want string) {
		t.Helper()
		buf := make([]byte, 64)
		if n, err := ca.Recv(ctxT(t, 2*time.Second), buf); err != nil || string(buf[:n]) != want {
			t.Fatalf("Recv: %q, %v; want %q (receiver %+v)", buf[:n], err, want, r.Stats())
		}
	}
	// The receive loop's next poll is held once it has taken A's first
	// message: armed while a poll is under way (that poll takes it), not
	// while the loop is between the poll that took A's first frame and the
	// next, which would hold A0 itself (4 runs in 120 under -race on a
	// loaded machine, once Accept waited for that frame).
	eventually(t, "the receive loop polling", func() (bool, string) { return hk.polling.Load(), "between polls" })
	hk.armed.Store(true)
	post(ini1, acc1, 1, "D\x00\x00\x00\x00A0")
	<-hk.held
	recv("A0")
	// A's second message: delivered into the SRQ through the old TGT, and
	// completed at A.
	post(ini1, acc1, 2, "D\x00\x00\x00\x01A1")
	for done := 0; done < 3; { // A's first frame and its two messages
		var wc [2]kernel.SendCompletion
		n, err := a.k.PollSend(ctxT(t, time.Second), ini1, wc[:])
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range wc[:n] {
			if c.Status != verbs.WCSuccess {
				t.Fatalf("A's send %d: %v", c.WRID, c.Status)
			}
		}
		done += n
	}
	// A recovers: the leg moves onto a new TGT; the old one had only r's
	// handle. B, another sender, gets a TGT at r: before the fix, the old
	// one's number.
	iniA2, accM := physLeg(t, a, r.Addr(), 1, wire.FlagMove)
	_, accB := physLeg(t, b, r.Addr(), 2, 0)
	t.Logf("old TGT %#x, A's new TGT %#x, B's TGT %#x", acc1.TGTQPN, accM.TGTQPN, accB.TGTQPN)
	hk.armed.Store(false)
	close(hk.release)
	recv("A1")
	// (B's connection is up at its first frame, which the held receive
	// loop takes only now.)
	if _, err := r.Accept(ctxT(t, 2*time.Second)); err != nil {
		t.Fatal(err)
	}
	post(iniA2, accM, 3, "D\x00\x00\x00\x02A2")
	recv("A2")
	eventually(t, "old TGT gone", func() (bool, string) {
		st := w.f.Node("10.0.53.2").Stats()
		return st.TGTs == 2 && r.Stats().Downlinks == 2, fmt.Sprint(st)
	})
}
