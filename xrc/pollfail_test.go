package xrc

import (
	"context"
	"errors"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/goxrc/goxrc/internal/kernel"
)

// pollFail makes the next send poll fail once armed, its completions lost,
// or with always every poll from then on: a poll that fails on a device (an
// arm or event read refused, the driver's poll failing; always: a CQ or
// device whose poll keeps failing, on every INI made after as on the one
// before) rather than because the INI was destroyed.
type pollFail struct {
	kernel.Kernel
	armed  atomic.Bool
	always bool
}

func (p *pollFail) PollSend(ctx context.Context, q kernel.QP, out []kernel.SendCompletion) (int, error) {
	if p.always && p.armed.Load() {
		return 0, syscall.EIO
	}
	n, err := p.Kernel.PollSend(ctx, q, out)
	if err == nil && !p.always && p.armed.CompareAndSwap(true, false) {
		return 0, syscall.EIO
	}
	return n, err
}

// pollFailPair connects s, whose kernel is p, to r, exchanges ten messages
// and arms p.
func pollFailPair(t *testing.T, p *pollFail) (s *proc, cs, cr *Conn, ctx context.Context) {
	w := newWorld(t)
	r := w.endpoint("10.0.7.4", 7000, longTimers)
	s = w.wrappedEndpoint("10.0.7.3", 7000, func(k kernel.Kernel) kernel.Kernel { p.Kernel = k; return p }, longTimers)
	cs, cr = pair(t, s, r)
	ctx = ctxT(t, 10*time.Second)
	if err := sendSeq(ctx, cs, 0, 10); err != nil {
		t.Fatal(err)
	}
	if err := recvSeq(ctx, cr, 0, 10, nil); err != nil {
		t.Fatal(err)
	}
	p.armed.Store(true)
	return s, cs, cr, ctx
}

// A send poll that failed ended the INI's completion dispatcher and left the
// INI up: the sends after it were posted with nothing to hear their
// completions, the send queue filled (256 on the model), and the next Send
// waited for room for ever. The failure now moves the uplink to
// RECOVERING, as a failed completion does, and the connection carries on.
func TestEndpointSendPollErrorRecovers(t *testing.T) {
	s, cs, cr, ctx := pollFailPair(t, &pollFail{})
	const last = 600 // past the send queue's depth
	got := make(chan error, 1)
	go func() { got <- recvSeq(ctx, cr, 10, last, nil) }()
	if err := sendSeq(ctx, cs, 10, last); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Recoveries != 1 {
		t.Fatalf("sender: %+v, want one recovery", st)
	}
	roundTrip(t, cr, cs, []byte("back after the failed poll"))
}

// A send poll that fails on every INI started a recovery, whose new INI's
// poll failed at once and started the next, for ever (over a thousand
// recoveries in 3 s), while Send waited out its deadline. The second failure
// in a row, with no completion taken between, fails the uplink's legs with
// the poll's error instead: two recoveries, and Send returns it.
func TestEndpointSendPollFailsAlways(t *testing.T) {
	s, cs, _, ctx := pollFailPair(t, &pollFail{always: true})
	err := sendSeq(ctx, cs, 10, 600)
	if !errors.Is(err, syscall.EIO) || !errors.Is(err, errSendPoll) {
		t.Fatalf("send: %v, want the failed poll's error", err)
	}
	if st := s.Stats(); st.Recoveries != 2 {
		t.Fatalf("sender: %d recoveries, want 2 (the second INI's poll failed too)", st.Recoveries)
	}
}
