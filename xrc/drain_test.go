package xrc

import (
	"context"
	"encoding/binary"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/verbs"
	"github.com/goxrc/goxrc/xrc/internal/wire"
)

// stallPoll holds the receive loop, once armed, right after a PollRecv
// returned (a goroutine descheduled between its poll and the end of its
// batch): the SRQ was empty at that poll, but the loop has not counted the
// drain yet.
type stallPoll struct {
	kernel.Kernel
	armed   atomic.Bool
	polled  chan struct{}
	release chan struct{}
}

func (k *stallPoll) PollRecv(ctx context.Context, s kernel.SRQ, out []kernel.RecvCompletion) (int, error) {
	n, err := k.Kernel.PollRecv(ctx, s, out)
	if n > 0 && k.armed.CompareAndSwap(true, false) {
		close(k.polled)
		<-k.release
	}
	return n, err
}

func dataFrame(seq uint32, s string) []byte {
	b := make([]byte, 1+dataSeqLen+len(s))
	b[0] = kindData
	binary.BigEndian.PutUint32(b[1:], seq)
	copy(b[1+dataSeqLen:], s)
	return b
}

// A message that reached the SRQ through the leg's old TGT before the MOVE,
// and whose sender had its successful completion (so recover does not send
// it again), was dropped when the receive loop's drain count moved between
// the MOVE and that message's poll for a poll that had found the SRQ empty
// before the message arrived (the count was taken after the batch). Polls
// are numbered now, and a drain counts as the poll's that found it empty.
func TestMovedLegKeepsMessageQueuedBeforeMove(t *testing.T) {
	w := newWorld(t)
	sk := &stallPoll{polled: make(chan struct{}), release: make(chan struct{})}
	r := w.wrappedEndpoint("10.0.53.2", 7001, func(k kernel.Kernel) kernel.Kernel { sk.Kernel = k; return sk })
	a := w.rawPeer("10.0.53.1", 7100)
	ini1, acc1 := physLeg(t, a, r.Addr(), 1, 0)
	ca, err := r.Accept(ctxT(t, 2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	post := func(q kernel.QP, seq uint32, s string) {
		t.Helper()
		if err := a.k.PostSend(q, []kernel.SendWR{{WRID: uint64(seq) + 1, RemoteSRQN: acc1.SRQN, Imm: acc1.AcceptorTag, Payload: dataFrame(seq, s)}}); err != nil {
			t.Fatal(err)
		}
	}
	// m1: polled alone (the SRQ is empty after it); the loop stalls there.
	sk.armed.Store(true)
	post(ini1, 0, "m1")
	<-sk.polled
	// m2 reaches the SRQ through the old TGT and completes at the sender.
	post(ini1, 1, "m2")
	var sc [4]kernel.SendCompletion
	for got := false; !got; {
		n, err := a.k.PollSend(ctxT(t, time.Second), ini1, sc[:])
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range sc[:n] {
			if c.Status != verbs.WCSuccess {
				t.Fatalf("send completion %+v", c)
			}
			got = got || c.WRID == 2
		}
	}
	// The sender recovers: the leg MOVEs onto a new TGT.
	physLeg(t, a, r.Addr(), 1, wire.FlagMove)
	close(sk.release)
	buf := make([]byte, 64)
	for _, want := range []string{"m1", "m2"} {
		n, err := ca.Recv(ctxT(t, time.Second), buf)
		if err != nil || string(buf[:n]) != want {
			t.Fatalf("want %q (in the SRQ before the MOVE, completed at the sender): got %q, %v (dropped %d)", want, buf[:n], err, r.Stats().Dropped)
		}
	}
}

// armedKeepaliveLocked is for kernel wrappers that act once, on a
// keepalive: if wrs is one keepalive and armed was set (it is cleared), it
// locks e.mu and returns the uplink whose current INI is q; otherwise
// (also when no uplink has q) nil, e.mu not held.
func (e *Endpoint) armedKeepaliveLocked(armed *atomic.Bool, q kernel.QP, wrs []kernel.SendWR) *uplink {
	if len(wrs) != 1 || len(wrs[0].Payload) != 1 || wrs[0].Payload[0] != kindHeartbeat || !armed.CompareAndSwap(true, false) {
		return nil
	}
	e.mu.Lock()
	for _, u := range e.uplinks {
		if u.cur != nil && u.cur.qp == q {
			return u
		}
	}
	e.mu.Unlock()
	return nil
}

// recoverFirst, once armed, makes the next keepalive post find its INI
// replaced: it starts the uplink's recovery itself and returns EIO only
// once the uplink is UP again on a new INI (the post went to the old one,
// which failed meanwhile).
type recoverFirst struct {
	kernel.Kernel
	e     *Endpoint
	armed atomic.Bool
}

func (k *recoverFirst) PostSend(q kernel.QP, wrs []kernel.SendWR) error {
	e := k.e
	u := e.armedKeepaliveLocked(&k.armed, q, wrs)
	if u == nil {
		return k.Kernel.PostSend(q, wrs)
	}
	old := u.cur
	e.failINILocked(u, old)
	e.mu.Unlock()
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		e.mu.Lock()
		up := u.state == upUp && u.cur != old
		e.mu.Unlock()
		if up {
			break
		}
	}
	return syscall.EIO
}

// Deterministic form of the race behind TestOneExchangeFirstFrameDuringRecovery's
// flakes (7 in 300 runs under -race with load): postFirstFrame waited for the
// uplink only while it was not UP when it looked after the failed post; an
// uplink that recovered in between (or whose INI the post went to was
// replaced) made it give up without a first frame, Dial returned, and the
// application's Close made the FIN the first frame: Accept never returned.
func TestOneExchangeFirstFrameAfterQuickRecovery(t *testing.T) {
	w := newWorld(t)
	slow := func(c *Config) { c.Heartbeat, c.IdleTimeout = 5*time.Second, 30*time.Second }
	rk := &recoverFirst{}
	a := w.wrappedEndpoint("10.0.54.1", 7000, func(k kernel.Kernel) kernel.Kernel { rk.Kernel = k; return rk }, slow)
	rk.e = a.Endpoint
	b := w.endpoint("10.0.54.2", 7000, slow)
	pair(t, a, b)
	dialClosingAtOnce(t, a, b, &rk.armed)
}
