package xrc

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/verbs"
)

// repostFail fails, once armed, the next receive poll that took messages,
// as the real kernel's PollRecv does when ibv_post_srq_recv fails: the
// messages were taken from the CQ and copied out, and are returned with
// the error.
type repostFail struct {
	kernel.Kernel
	armed atomic.Bool
}

func (k *repostFail) PollRecv(ctx context.Context, s kernel.SRQ, out []kernel.RecvCompletion) (int, error) {
	n, err := k.Kernel.PollRecv(ctx, s, out)
	if n > 0 && err == nil && k.armed.CompareAndSwap(true, false) {
		err = &verbs.OpError{Op: "ibv_post_srq_recv", Err: syscall.EIO}
	}
	return n, err
}

// A receive poll that fails with messages taken (its repost of their slots
// failed) ends the endpoint; the messages it took came all the same. The
// receive loop threw them away: neither delivered nor counted in
// Stats.Dropped, which counts every received message dropped, though the
// sender had them acked. They are delivered now, before the poll's error
// ends their connection: Recv gives them, then the error.
func TestRecvPollErrorDeliversWhatItTook(t *testing.T) {
	w := newWorld(t)
	k := &repostFail{}
	s := w.endpoint("10.0.134.1", 7000, longTimers)
	r := w.wrappedEndpoint("10.0.134.2", 7000, func(kk kernel.Kernel) kernel.Kernel { k.Kernel = kk; return k }, longTimers)
	cs, cr := pair(t, s, r)
	roundTrip(t, cs, cr, []byte("before"))
	before := r.Stats()
	k.armed.Store(true)
	msg := []byte("taken as the repost failed")
	if err := cs.Send(ctxT(t, time.Second), msg); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the endpoint ended by the failed poll", func() (bool, string) {
		select {
		case <-r.dead:
			return true, ""
		default:
			return false, "alive"
		}
	})
	buf := make([]byte, 64)
	n, err := cr.Recv(ctxT(t, time.Second), buf)
	if err != nil || !bytes.Equal(buf[:n], msg) {
		t.Errorf("recv: %q %v, want %q (then the poll's error); dropped %d before, %d after",
			buf[:n], err, msg, before.Dropped, r.Stats().Dropped)
	}
	if _, err := cr.Recv(ctxT(t, time.Second), buf); !errors.Is(err, syscall.EIO) {
		t.Errorf("recv after the message: %v, want the poll's error", err)
	}
	if got := r.Stats().Dropped; got != before.Dropped {
		t.Errorf("dropped %d, want %d", got, before.Dropped)
	}
}
