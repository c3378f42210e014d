package xrc

import (
	"errors"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// finFull signals the first FIN whose PostSend found the send queue full.
type finFull struct {
	wrapper
	full chan struct{}
	once sync.Once
}

func (k *finFull) PostSend(q kernel.QP, wrs []kernel.SendWR) error {
	err := k.Kernel.PostSend(q, wrs)
	if errors.Is(err, syscall.ENOMEM) && len(wrs) == 1 && len(wrs[0].Payload) > 0 && wrs[0].Payload[0] == kindFIN {
		k.once.Do(func() { close(k.full) })
	}
	return err
}

// An acceptor whose half failed while its reciprocal request was on its way
// (reciprocalToFailedHalf), and whose dialer took the leg, tells the dialer
// by a FIN on the leg and sends no ABORT (Conn.revFIN). Where that FIN
// could not be posted (here the INI's one send-queue slot is held by a
// frame to a stopped receiver: PostSend says ENOMEM), neither went: the
// dialer's connection heard nothing until its idle timeout (a minute
// here), though the ABORT would end it (abortTakenLocked).
func TestFailedHalfFINNotPostedAborts(t *testing.T) {
	w := newWorld(t)
	w.f.AddNode("10.0.108.1", memfabric.NodeConfig{SRQReceives: 1})
	w.f.AddNode("10.0.108.2", memfabric.NodeConfig{SRQReceives: 4, SendQueueDepth: 1})
	minute := func(c *Config) { c.IdleTimeout = time.Minute }
	a := w.endpoint("10.0.108.1", 7000, minute)
	rk := &holdReciprocal{held: make(chan struct{}), release: make(chan struct{})}
	fk := &finFull{full: make(chan struct{})}
	b := w.wrappedEndpoint("10.0.108.2", 7000, func(k kernel.Kernel) kernel.Kernel {
		rk.Kernel = k
		fk.Kernel = rk
		return fk
	})
	p := w.endpoint("10.0.108.2", 7001, longTimers) // the receiver that stops
	q := w.endpoint("10.0.108.1", 7001, minute)     // a receiver there that stops too
	toP, _ := pair(t, a, p)
	qb, bq := pair(t, q, b) // b's uplink to a's node, whose one slot a frame to q holds
	ctx := ctxT(t, 10*time.Second)
	stallBehind(t, ctx, toP, p)
	var once sync.Once
	release := func() { once.Do(func() { close(rk.release) }) }
	t.Cleanup(release) // a setup that fails lets the request go
	dialed, _ := halfFailedUnderReciprocal(t, a, b, rk)
	// q stops, and a frame of b's to it, refused for want of a receive,
	// holds the one slot of b's INI (nothing else reaches a's node now):
	// the FIN finds the send queue full.
	q.p.PauseReceives()
	t.Cleanup(q.p.ResumeReceives)
	node := w.f.Node("10.0.108.1")
	before := node.Stats().RNRNAKs
	sent := make(chan error, 1)
	go func() { sent <- sendSeq(ctx, bq, 0, 2) }()
	eventually(t, "b's frame to q waits at b's INI", func() (bool, string) {
		return node.Stats().RNRNAKs > before, ""
	})
	release()
	awaitSetup(t, fk.full, "the FIN to the failed half found room")
	res := <-dialed
	if res.err == nil {
		_, res.err = res.c.Recv(ctxT(t, 5*time.Second), make([]byte, 8))
		res.c.Close()
	}
	if !errors.Is(res.err, errReverseAborted) {
		t.Fatalf("the dial (or its connection's Recv) failed with %v; want the acceptor's ABORT", res.err)
	}
	q.p.ResumeReceives()
	p.p.ResumeReceives()
	if err := <-sent; err != nil {
		t.Fatal(err)
	}
	for _, c := range []*Conn{toP, qb, bq} {
		c.Close()
	}
	requireNoLeftovers(t, a, b, p, q)
}
