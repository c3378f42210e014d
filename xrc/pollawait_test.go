package xrc

import (
	"context"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// idlePollFail is pollFail that can also fail a send poll with nothing to
// take (failIdle): its wait for a completion fails, as a completion
// channel's read may.
type idlePollFail struct {
	pollFail
	mu      sync.Mutex
	waiting map[kernel.QP]context.CancelFunc // the polls under way
	fail    map[kernel.QP]bool               // the next poll of the QP that takes nothing fails
}

func (k *idlePollFail) PollSend(ctx context.Context, q kernel.QP, out []kernel.SendCompletion) (int, error) {
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	k.mu.Lock()
	if k.fail[q] {
		delete(k.fail, q)
		k.mu.Unlock()
		return 0, syscall.EIO
	}
	k.waiting[q] = cancel
	k.mu.Unlock()
	n, err := k.pollFail.PollSend(pctx, q, out)
	k.mu.Lock()
	delete(k.waiting, q)
	failed := n == 0 && k.fail[q] && ctx.Err() == nil
	if failed {
		delete(k.fail, q)
	}
	k.mu.Unlock()
	if failed {
		return 0, syscall.EIO
	}
	return n, err
}

// failIdle fails q's send poll under way, or its next, with nothing taken.
func (k *idlePollFail) failIdle(q kernel.QP) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.fail[q] = true
	if cancel := k.waiting[q]; cancel != nil {
		cancel()
	}
}

// Two one-off send poll failures apart on the acceptor's uplink whose only
// leg is an inbound half waiting for its dialer's first frame
// (awaitFirst), the second on the half's first message: the second
// recovery spares the connection, the message arrives, both ways carry
// messages after it, and the dialer drops no frame. It guards against the
// second failure being taken for a poll that fails on every INI
// (errSendPoll), failing the connection, because such a half sends nothing
// (protocol step 5) that proves the new INI's poll, as
// TestHeldDialSendPollFailsTwiceApart for a held dial.
func TestAwaitFirstSendPollFailsTwiceApart(t *testing.T) {
	w := newWorld(t)
	hk := &holdFirst{held: make(chan struct{}), release: make(chan struct{})}
	t.Cleanup(func() {
		select {
		case <-hk.release:
		default:
			close(hk.release)
		}
	})
	hk.armed.Store(true) // a's first frame on the forward leg waits
	a := w.wrappedEndpoint("10.0.98.7", 7000, func(k kernel.Kernel) kernel.Kernel { hk.Kernel = k; return hk }, longTimers)
	p := &idlePollFail{waiting: map[kernel.QP]context.CancelFunc{}, fail: map[kernel.QP]bool{}}
	b := w.wrappedEndpoint("10.0.98.8", 7000, func(k kernel.Kernel) kernel.Kernel { p.Kernel = k; return p }, longTimers)
	ctx := ctxT(t, 10*time.Second)
	dialed := dialIn(ctx, a, b)
	awaitSetup(t, hk.held, "the dial sent no first frame")
	var q kernel.QP
	eventually(t, "b's half up on its reverse leg, waiting for the first frame", func() (bool, string) {
		b.mu.Lock()
		defer b.mu.Unlock()
		var h *Conn
		for k := range b.conns {
			h = k
		}
		if h == nil || len(b.uplinks) != 1 || b.uplinks[0].cur == nil {
			return false, "no half"
		}
		u := b.uplinks[0]
		q = u.cur.qp
		return h.awaitFirst && h.sendUp && u.state == upUp && !u.settling, fmt.Sprint("awaitFirst ", h.awaitFirst, " sendUp ", h.sendUp)
	})
	p.failIdle(q) // the uplink's first poll failure: a recovery
	eventually(t, "the recovery done and its posts polled", func() (bool, string) {
		b.mu.Lock()
		defer b.mu.Unlock()
		u := b.uplinks[0]
		return b.recoveries.Load() == 1 && u.state == upUp && !u.settling && len(u.cur.waiters) == 0, ""
	})
	p.armed.Store(true) // the next poll that takes a completion fails
	close(hk.release)
	c, d := dialedAccepted(t, dialed, b)
	defer c.Close()
	defer d.Close()
	if err := d.Send(ctx, []byte("first")); err != nil { // its poll fails
		t.Fatalf("send: %v", err)
	}
	requireSecondRecoverySpares(t, b, d)
	buf := make([]byte, 64)
	if n, err := c.Recv(ctx, buf); err != nil || string(buf[:n]) != "first" {
		t.Fatalf("recv: %q, %v", buf[:n], err)
	}
	roundTrip(t, c, d, []byte("forward"))
	roundTrip(t, d, c, []byte("reverse"))
	if n := a.Stats().Dropped; n != 0 {
		t.Fatalf("the dialer dropped %d frames", n) // the half's probe is a credit frame of its dial's
	}
}
