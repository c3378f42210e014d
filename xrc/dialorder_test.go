package xrc

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/verbs"
)

// flushFirst, once armed, has the next keepalive post flushed: the INI it
// goes to fails as it is posted, and the post lands on it once the
// recovery has moved it to ERR (which flushes what it holds). The post
// itself succeeds: the frame is lost at its completion, as a send queued
// behind a failing one is on a device.
type flushFirst struct {
	kernel.Kernel
	e       *Endpoint
	armed   atomic.Bool
	target  atomic.Uint64 // the INI whose move to ERR errd reports
	errd    chan struct{} // closed once target is in ERR
	posting atomic.Uint64 // the INI the keepalive is to be posted on
	posted  chan struct{} // closed once it was
	flushed atomic.Bool   // the keepalive was posted on the INI in ERR
}

// DestroyQP holds the INI the keepalive is for until it is posted: the
// recovery, which has it in ERR and sees nothing in flight on it, may
// destroy it at once, and the post, which the engine makes under its lock
// (this wrapper lets go of it), then failed.
func (k *flushFirst) DestroyQP(q kernel.QP) error {
	if uint64(q) == k.posting.Load() {
		<-k.posted
	}
	return k.Kernel.DestroyQP(q)
}

func (k *flushFirst) TransitionQP(q kernel.QP, to verbs.QPState, via kernel.ID) error {
	err := k.Kernel.TransitionQP(q, to, via)
	if to == verbs.QPStateErr && k.target.CompareAndSwap(uint64(q), 0) {
		close(k.errd)
	}
	return err
}

func (k *flushFirst) PostSend(q kernel.QP, wrs []kernel.SendWR) error {
	e := k.e
	u := e.armedKeepaliveLocked(&k.armed, q, wrs)
	if u == nil {
		return k.Kernel.PostSend(q, wrs)
	}
	k.target.Store(uint64(q))
	k.posting.Store(uint64(q))
	e.failINILocked(u, u.cur)
	e.mu.Unlock()
	<-k.errd
	err := k.Kernel.PostSend(q, wrs) // on the old INI, in ERR: flushed
	k.flushed.Store(err == nil)
	close(k.posted)
	return err
}

// A one-exchange dial's first frame (the keepalive that completes the
// acceptor's half) was posted, and Dial returned the connection, but the
// INI failed before the frame went out: the recovery that moved the leg
// sends again only data frames, so an application that closed without
// sending made its FIN the first frame the acceptor got, which it takes for
// an abandoned attempt. Accept never returned a connection Dial had
// returned, and the dialer's half waited for the acceptor's FIN until its
// idle timeout.
func TestOneExchangeFirstFrameFlushed(t *testing.T) {
	w := newWorld(t)
	slow := func(c *Config) { c.Heartbeat, c.IdleTimeout = 5*time.Second, 30*time.Second } // no janitor keepalive in the test
	fk := &flushFirst{errd: make(chan struct{}), posted: make(chan struct{})}
	a := w.wrappedEndpoint("10.0.55.1", 7000, func(k kernel.Kernel) kernel.Kernel { fk.Kernel = k; return fk }, slow)
	fk.e = a.Endpoint
	b := w.endpoint("10.0.55.2", 7000, slow)
	pair(t, a, b) // uplinks both ways: the next dial takes one exchange
	one := a.Stats().OneExchange
	dialClosingAtOnce(t, a, b, &fk.armed)
	if a.Stats().OneExchange == one || !fk.flushed.Load() {
		t.Fatalf("setup: one exchange %v, first frame flushed %v", a.Stats().OneExchange > one, fk.flushed.Load())
	}
}
