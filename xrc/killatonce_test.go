package xrc

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// deathHeldKernel holds back what the engine's loops learn of the
// process's death (the failures of Event, PollRecv and PollSend after it) until
// release is closed: the window between Kill and die, made as long as a
// test needs.
type deathHeldKernel struct {
	wrapper
	dead    <-chan struct{}
	release <-chan struct{}
}

func (k deathHeldKernel) hold(ctx context.Context, err error) error {
	if err != nil && closed(k.dead) {
		select {
		case <-k.release:
		case <-ctx.Done():
		}
	}
	return err
}

func (k deathHeldKernel) Event(ctx context.Context, id kernel.ID) (kernel.Event, error) {
	ev, err := k.wrapper.Event(ctx, id)
	return ev, k.hold(ctx, err)
}

func (k deathHeldKernel) PollRecv(ctx context.Context, s kernel.SRQ, out []kernel.RecvCompletion) (int, error) {
	n, err := k.wrapper.PollRecv(ctx, s, out)
	return n, k.hold(ctx, err)
}

func (k deathHeldKernel) PollSend(ctx context.Context, q kernel.QP, out []kernel.SendCompletion) (int, error) {
	n, err := k.wrapper.PollSend(ctx, q, out)
	return n, k.hold(ctx, err)
}

// TestProcessDeathSaidFromKillOn: once Kill returns, the endpoint's Err,
// its connections' Err, Send and CloseWrite say ErrProcessDied (memfabric's
// Kill: "Engines running on it fail from then on, with xrc.ErrProcessDied
// (their Err, their calls and their connections')"), before the engine's
// loops have learned of the death from their own kernel calls (die). They
// said nil until then: Err as if the endpoint worked, and Send took a
// message that a dead process never sends.
func TestProcessDeathSaidFromKillOn(t *testing.T) {
	w := newWorld(t)
	release := make(chan struct{})
	defer close(release)
	var dead <-chan struct{}
	a := w.wrappedEndpoint("10.0.199.1", 7000, func(k kernel.Kernel) kernel.Kernel {
		dead = k.(interface{ Dead() <-chan struct{} }).Dead()
		return deathHeldKernel{wrapper{k}, dead, release}
	})
	b := w.endpoint("10.0.199.2", 7000)
	ca, _ := pair(t, a, b)
	a.p.Kill()
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, ErrProcessDied) || errors.Is(err, ErrClosed) {
			t.Errorf("%s right after the process's kill: %v, want ErrProcessDied", what, err)
		}
	}
	check("Endpoint.Err", a.Err())
	check("Conn.Err", ca.Err())
	check("Send", ca.Send(ctxT(t, time.Second), []byte("x")))
	check("CloseWrite", ca.CloseWrite())
}
