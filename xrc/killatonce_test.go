package xrc

import (
	"context"
	"errors"
	"fmt"
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

// deathHeldPair connects an endpoint at 10.0.N.1, whose kernel holds back
// what its loops learn of its process's death until the test ends, to one
// at 10.0.N.2 (with more options each), and returns the first's end.
func deathHeldPair(t *testing.T, n int, aOpts, bOpts []func(*Config)) (a *proc, ca *Conn) {
	w := newWorld(t)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	a = w.wrappedEndpoint(fmt.Sprintf("10.0.%d.1", n), 7000, func(k kernel.Kernel) kernel.Kernel {
		return deathHeldKernel{wrapper{k}, k.(interface{ Dead() <-chan struct{} }).Dead(), release}
	}, aOpts...)
	b := w.endpoint(fmt.Sprintf("10.0.%d.2", n), 7000, bOpts...)
	ca, _ = pair(t, a, b)
	return a, ca
}

// TestProcessDeathSaidFromKillOn: once Kill returns, the endpoint's Err,
// its connections' Err, Send and CloseWrite say ErrProcessDied (memfabric's
// Kill: "Engines running on it fail from then on, with xrc.ErrProcessDied
// (their Err, their calls and their connections')"), before the engine's
// loops have learned of the death from their own kernel calls (die). They
// said nil until then: Err as if the endpoint worked, and Send took a
// message that a dead process never sends.
func TestProcessDeathSaidFromKillOn(t *testing.T) {
	a, ca := deathHeldPair(t, 199, nil, nil)
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

// TestRecvSaysProcessDeathFromKillOn: Recv agrees with Err once Kill
// returns. It said ctx's error (its doc: only while the connection has not
// ended), with Err saying ErrProcessDied, and a Recv waiting at the Kill
// waited on for die.
func TestRecvSaysProcessDeathFromKillOn(t *testing.T) {
	a, ca := deathHeldPair(t, 198, nil, nil)
	waiting := make(chan error, 1)
	go func() {
		_, err := ca.Recv(ctxT(t, 10*time.Second), make([]byte, 16))
		waiting <- err
	}()
	a.p.Kill()
	done, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := ca.Recv(done, make([]byte, 16)); !errors.Is(err, ErrProcessDied) {
		t.Errorf("Recv right after the process's kill: %v, want ErrProcessDied (Err: %v)", err, ca.Err())
	}
	if err := <-waiting; !errors.Is(err, ErrProcessDied) {
		t.Errorf("Recv waiting at the process's kill: %v, want ErrProcessDied", err)
	}
}

// TestWaitingSendSaysProcessDeathFromKillOn: a Send waiting for a credit
// at the Kill says ErrProcessDied, as one called after it does. It waited
// on for die, and said ctx's error where ctx ended first.
func TestWaitingSendSaysProcessDeathFromKillOn(t *testing.T) {
	a, ca := deathHeldPair(t, 197, []func(*Config){longTimers}, []func(*Config){longTimers, func(c *Config) { c.RecvWindow = 1 }})
	// The window's one credit: b reads nothing, so the next Send waits.
	if err := ca.Send(ctxT(t, 5*time.Second), []byte("x")); err != nil {
		t.Fatal(err)
	}
	ctx := &endingCtx{
		at: func() bool {
			a.mu.Lock()
			defer a.mu.Unlock()
			return ca.creditWait
		},
		end: a.p.Kill,
	}
	if err := ca.Send(ctx, []byte("y")); !errors.Is(err, ErrProcessDied) {
		t.Errorf("Send waiting for a credit at the process's kill: %v, want ErrProcessDied (Err: %v)", err, ca.Err())
	}
	if ctx.Err() == nil {
		t.Fatal("the Send never waited for a credit: nothing was tested")
	}
}

// TestCloseWriteAfterKillLeavesSendSayingProcessDeath: a CloseWrite after
// the Kill sends nothing and closes nothing, as after die: the Send after
// it said ErrClosed (the application's end, to cm), not ErrProcessDied.
func TestCloseWriteAfterKillLeavesSendSayingProcessDeath(t *testing.T) {
	a, ca := deathHeldPair(t, 196, nil, nil)
	a.p.Kill()
	if err := ca.CloseWrite(); !errors.Is(err, ErrProcessDied) {
		t.Errorf("CloseWrite right after the process's kill: %v, want ErrProcessDied", err)
	}
	if err := ca.Send(ctxT(t, time.Second), []byte("x")); !errors.Is(err, ErrProcessDied) || errors.Is(err, ErrClosed) {
		t.Errorf("Send after that CloseWrite: %v, want ErrProcessDied", err)
	}
}
