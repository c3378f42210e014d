package cm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/xrc/memfabric"
)

// parityPair is a connection on RC (the fake transport) or on XRC (the
// in-memory fabric): a is the dialer, the side the scenarios watch; b its
// peer.
type parityPair struct {
	ctx  context.Context
	a, b *Conn
	// kill makes b's process die: no FIN, its kernel disconnects; killA
	// a's.
	kill, killA func()
	// stallA makes a's process take no message until killA: a stalled
	// process, which answers no FIN.
	stallA func()
	// holdA keeps a's side from hearing of b's end (RC: the CM's word of
	// the disconnect; XRC: b's FIN, left on a's SRQ) until the function
	// it returns.
	holdA func() (release func())
	// loseA makes a's device go away (a device removal; over XRC a fatal
	// device error) and returns once a has taken that in.
	loseA func()
	// settle waits, after kill, until a's side has taken in b's death:
	// on XRC a Send's failure is provisional, and the engine decides a
	// moment later. settleB is settle for b, after killA.
	settle, settleB func()
}

const parityDepth = 4

func rcParityPair(t *testing.T) *parityPair {
	a, b, w := fakePair(t, fakeOpts{depth: [2]int{parityDepth, parityDepth}})
	return &parityPair{ctx: ctxT(t), a: a, b: b, kill: func() {
		// As TestStatsPeerDeathCounted: b's QP is gone, and a's CM
		// reports the disconnect its kernel made.
		w.ends[1].shutdown()
		a.peerGone("peer disconnected")
	}, killA: func() {
		w.ends[0].shutdown()
		b.peerGone("peer disconnected")
	}, loseA: func() {
		a.deviceRemoved()
		<-a.freed // released by deviceLost's Close
	}, stallA: func() {}, settle: func() {}, settleB: func() {}, holdA: func() func() {
		said := make(chan string, 1)
		w.mu.Lock()
		gone := w.ends[0].onPeerGone
		w.ends[0].onPeerGone = func(reason string) { said <- reason }
		w.mu.Unlock()
		return func() {
			w.mu.Lock()
			w.ends[0].onPeerGone = gone
			w.mu.Unlock()
			select {
			case reason := <-said:
				gone(reason)
			default:
			}
		}
	}}
}

func xrcParityPair(t *testing.T) *parityPair { return xrcParityPairWith(t) }

// xrcParityPairWith is xrcParityPair with more options on both ends.
func xrcParityPairWith(t *testing.T, more ...Option) *parityPair {
	ctx := ctxT(t)
	f := newFabric(t)
	srv, cli := f.Node("10.1.0.1").Process(), f.Node("10.1.0.2").Process()
	opts := append([]Option{WithQueueDepth(parityDepth)}, more...)
	a, b := fabricPair(ctx, t, srv, cli, opts, opts)
	// The engine forgets a connection once both its legs are gone.
	gone := func(p *memfabric.Process) func() {
		return func() { awaitConns(t, endpointOf(t, p), 0, 10*time.Second) }
	}
	return &parityPair{ctx: ctx, a: a, b: b, kill: srv.Kill, killA: cli.Kill, stallA: cli.PauseReceives,
		holdA: func() func() { cli.PauseReceives(); return cli.ResumeReceives },
		loseA: func() {
			f.Node("10.1.0.2").FailDevice()
			gone(cli)()
		},
		settle: gone(cli), settleB: gone(srv)}
}

// parityTransports makes the pairs each scenario runs on.
var parityTransports = []struct {
	name string
	pair func(*testing.T) *parityPair
}{{"RC", rcParityPair}, {"XRC", xrcParityPair}}

// errClass names what err means to a caller of cm: the exported errors it
// matches (errors.Is), ErrPeerGone before ErrClosed.
func errClass(err error) string {
	switch {
	case err == nil:
		return "nil"
	case errors.Is(err, io.EOF):
		return "EOF"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	case errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, ErrPeerGone):
		return "peer gone"
	case errors.Is(err, ErrClosed):
		return "closed"
	case errors.Is(err, ErrMessageTooLong):
		return "too long"
	}
	return "other: " + err.Error()
}

// parityLog records the outcomes of a scenario, one line each.
type parityLog []string

func (l *parityLog) err(what string, err error) { *l = append(*l, what+": "+errClass(err)) }

func (l *parityLog) errors(what string, c *Conn) {
	*l = append(*l, fmt.Sprintf("%s.Errors: %d", what, c.Stats().Errors))
}

// calls records Send, Recv, CloseWrite and Close on c, in that order.
func (l *parityLog) calls(p *parityPair, name string, c *Conn) {
	l.err(name+".Send", c.Send(p.ctx, []byte("late")))
	_, err := c.Recv(p.ctx, make([]byte, 64))
	l.err(name+".Recv", err)
	l.err(name+".CloseWrite", c.CloseWrite())
	l.err(name+".Close", c.Close())
	l.errors(name, c)
}

// waitParked waits until a goroutine of the test is parked in fn (a Send or
// Recv that waits), not merely on its way there.
func waitParked(t *testing.T, fn string) {
	t.Helper()
	waitParkedN(t, fn, 1)
}

// waitParkedN is waitParked for n goroutines.
func waitParkedN(t *testing.T, fn string, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		parked := 0
		for _, g := range ourGoroutines() {
			head, _, _ := strings.Cut(g, "\n")
			if strings.Contains(g, fn) && (strings.Contains(head, "[select") || strings.Contains(head, "[chan receive")) {
				parked++
			}
		}
		if parked >= n {
			return
		}
	}
	t.Fatalf("%d goroutines not parked in %s", n, fn)
}

// fillCredits sends what the peer's window takes, so that the next Send
// waits for credit.
func fillCredits(t *testing.T, p *parityPair) {
	t.Helper()
	for i := range parityDepth {
		require.NoError(t, p.a.Send(p.ctx, []byte("unread")), "message %d of the window", i)
	}
}

// blockedSend starts a Send from a that waits for credit, and returns its
// result's channel once it waits.
func blockedSend(t *testing.T, p *parityPair) <-chan error {
	fillCredits(t, p)
	errc := make(chan error, 1)
	go func() { errc <- p.a.Send(p.ctx, []byte("no credit for this")) }()
	waitParked(t, "cm.(*Conn).Send")
	return errc
}

func blockedRecv(t *testing.T, p *parityPair) <-chan error {
	errc := make(chan error, 1)
	go func() {
		_, err := p.a.Recv(p.ctx, make([]byte, 64))
		errc <- err
	}()
	waitParked(t, "cm.(*Conn).Recv")
	return errc
}

// sendAll sends on c until a Send fails (the failure of a post comes
// later), and records that failure.
func (l *parityLog) sendAll(p *parityPair, name string, c *Conn) {
	for {
		if err := c.Send(p.ctx, []byte("to the dead")); err != nil {
			l.err(name+".Send", err)
			return
		}
	}
}

// recvAll reads c until it fails, and records that failure.
func (l *parityLog) recvAll(p *parityPair, name string, c *Conn) {
	buf := make([]byte, 64)
	for {
		if _, err := c.Recv(p.ctx, buf); err != nil {
			l.err(name+".Recv", err)
			return
		}
	}
}

// bHalfClosesAndDies: b half-closes, a reads to its end, b dies, and a
// sends until that fails and takes the death in.
func (l *parityLog) bHalfClosesAndDies(p *parityPair) {
	l.err("b.CloseWrite", p.b.CloseWrite())
	l.recvAll(p, "a", p.a)
	p.kill()
	l.sendAll(p, "a", p.a)
	p.settle()
}

var parityScenarios = []struct {
	name string
	run  func(t *testing.T, p *parityPair, l *parityLog)
	want []string
}{
	{
		name: "a closes",
		run: func(t *testing.T, p *parityPair, l *parityLog) {
			l.err("a.Close", p.a.Close())
			l.recvAll(p, "b", p.b)
			l.calls(p, "a", p.a)
			l.calls(p, "b", p.b)
		},
		want: []string{
			"a.Close: nil", "b.Recv: EOF",
			"a.Send: closed", "a.Recv: closed", "a.CloseWrite: closed", "a.Close: nil", "a.Errors: 0",
			"b.Send: peer gone", "b.Recv: EOF", "b.CloseWrite: peer gone", "b.Close: nil", "b.Errors: 0",
		},
	},
	{
		name: "b closes",
		run: func(t *testing.T, p *parityPair, l *parityLog) {
			l.err("b.Close", p.b.Close())
			l.recvAll(p, "a", p.a)
			l.calls(p, "b", p.b)
			l.calls(p, "a", p.a)
		},
		want: []string{
			"b.Close: nil", "a.Recv: EOF",
			"b.Send: closed", "b.Recv: closed", "b.CloseWrite: closed", "b.Close: nil", "b.Errors: 0",
			"a.Send: peer gone", "a.Recv: EOF", "a.CloseWrite: peer gone", "a.Close: nil", "a.Errors: 0",
		},
	},
	{
		name: "a half-closes, b reads EOF and closes",
		run: func(t *testing.T, p *parityPair, l *parityLog) {
			require.NoError(t, p.a.Send(p.ctx, []byte("before the FIN")))
			l.err("a.CloseWrite", p.a.CloseWrite())
			l.recvAll(p, "b", p.b)
			require.NoError(t, p.b.Send(p.ctx, []byte("answer")))
			l.err("b.Close", p.b.Close())
			_, err := p.a.Recv(p.ctx, make([]byte, 64))
			l.err("a.Recv answer", err)
			l.calls(p, "a", p.a)
			l.errors("b", p.b)
		},
		want: []string{
			"a.CloseWrite: nil", "b.Recv: EOF", "b.Close: nil", "a.Recv answer: nil",
			"a.Send: closed", "a.Recv: EOF", "a.CloseWrite: nil", "a.Close: nil", "a.Errors: 0",
			"b.Errors: 0",
		},
	},
	{
		name: "a half-closes, b dies",
		run: func(t *testing.T, p *parityPair, l *parityLog) {
			l.err("a.CloseWrite", p.a.CloseWrite())
			l.recvAll(p, "b", p.b)
			p.kill()
			l.calls(p, "a", p.a)
		},
		want: []string{
			"a.CloseWrite: nil", "b.Recv: EOF",
			"a.Send: closed", "a.Recv: peer gone", "a.CloseWrite: nil", "a.Close: nil", "a.Errors: 1",
		},
	},
	{
		name: "b half-closes, a reads EOF, b dies",
		run: func(t *testing.T, p *parityPair, l *parityLog) {
			l.bHalfClosesAndDies(p)
			l.calls(p, "a", p.a)
		},
		want: []string{
			"b.CloseWrite: nil", "a.Recv: EOF", "a.Send: peer gone",
			"a.Send: peer gone", "a.Recv: EOF", "a.CloseWrite: peer gone", "a.Close: nil", "a.Errors: 0",
		},
	},
	{
		name: "b dies, a's Send blocked for credit",
		run: func(t *testing.T, p *parityPair, l *parityLog) {
			errc := blockedSend(t, p)
			p.kill()
			l.err("a.Send blocked", <-errc)
			l.calls(p, "a", p.a)
		},
		want: []string{
			"a.Send blocked: peer gone",
			"a.Send: peer gone", "a.Recv: peer gone", "a.CloseWrite: peer gone", "a.Close: nil", "a.Errors: 1",
		},
	},
	{
		name: "b dies, a's Recv blocked",
		run: func(t *testing.T, p *parityPair, l *parityLog) {
			errc := blockedRecv(t, p)
			p.kill()
			l.err("a.Recv blocked", <-errc)
			l.calls(p, "a", p.a)
		},
		want: []string{
			"a.Recv blocked: peer gone",
			"a.Send: peer gone", "a.Recv: peer gone", "a.CloseWrite: peer gone", "a.Close: nil", "a.Errors: 1",
		},
	},
	{
		name: "a's blocked Recv meets its deadline, then the connection goes on",
		run: func(t *testing.T, p *parityPair, l *parityLog) {
			short, cancel := context.WithTimeout(p.ctx, 10*time.Millisecond)
			_, err := p.a.Recv(short, make([]byte, 64))
			cancel()
			l.err("a.Recv deadline", err)
			canceled, cancel := context.WithCancel(p.ctx)
			errc := make(chan error, 1)
			go func() { _, err := p.a.Recv(canceled, make([]byte, 64)); errc <- err }()
			waitParked(t, "cm.(*Conn).Recv")
			cancel()
			l.err("a.Recv canceled", <-errc)
			l.err("b.Send", p.b.Send(p.ctx, []byte("ping")))
			_, err = p.a.Recv(p.ctx, make([]byte, 64))
			l.err("a.Recv", err)
			l.err("a.Send", p.a.Send(p.ctx, []byte("pong")))
			_, err = p.b.Recv(p.ctx, make([]byte, 64))
			l.err("b.Recv", err)
			l.errors("a", p.a)
			l.errors("b", p.b)
		},
		want: []string{
			"a.Recv deadline: deadline", "a.Recv canceled: canceled",
			"b.Send: nil", "a.Recv: nil", "a.Send: nil", "b.Recv: nil", "a.Errors: 0", "b.Errors: 0",
		},
	},
	{
		name: "a's Send blocked for credit meets its deadline, then the connection goes on",
		run: func(t *testing.T, p *parityPair, l *parityLog) {
			fillCredits(t, p)
			short, cancel := context.WithTimeout(p.ctx, 10*time.Millisecond)
			l.err("a.Send deadline", p.a.Send(short, []byte("no credit")))
			cancel()
			buf := make([]byte, 64)
			for range parityDepth {
				_, err := p.b.Recv(p.ctx, buf)
				require.NoError(t, err)
			}
			l.err("a.Send", p.a.Send(p.ctx, []byte("credit back")))
			n, err := p.b.Recv(p.ctx, buf)
			l.err("b.Recv", err)
			require.Equal(t, "credit back", string(buf[:n]), "the Send the deadline ended sent nothing")
			l.errors("a", p.a)
			l.errors("b", p.b)
		},
		want: []string{"a.Send deadline: deadline", "a.Send: nil", "b.Recv: nil", "a.Errors: 0", "b.Errors: 0"},
	},
	{
		name: "a closes while its Recv is blocked",
		run: func(t *testing.T, p *parityPair, l *parityLog) {
			errc := blockedRecv(t, p)
			l.err("a.Close", p.a.Close())
			l.err("a.Recv blocked", <-errc)
			l.recvAll(p, "b", p.b)
			l.errors("a", p.a)
			l.errors("b", p.b)
		},
		want: []string{"a.Close: nil", "a.Recv blocked: closed", "b.Recv: EOF", "a.Errors: 0", "b.Errors: 0"},
	},
	{
		// a reads to the FIN before it calls the rest: a Send between the
		// last message and the FIN raced the FIN's arrival (on XRC the
		// engine queues each message apart, and a Send slipped in before
		// the FIN behind them: 17 runs in 400 under load).
		name: "b closes with messages unread by a",
		run: func(t *testing.T, p *parityPair, l *parityLog) {
			for range 3 {
				require.NoError(t, p.b.Send(p.ctx, []byte("unread")))
			}
			l.err("b.Close", p.b.Close())
			buf := make([]byte, 64)
			for range 3 {
				_, err := p.a.Recv(p.ctx, buf)
				l.err("a.Recv", err)
			}
			l.recvAll(p, "a", p.a)
			l.calls(p, "a", p.a)
		},
		want: []string{
			"b.Close: nil", "a.Recv: nil", "a.Recv: nil", "a.Recv: nil", "a.Recv: EOF",
			"a.Send: peer gone", "a.Recv: EOF", "a.CloseWrite: peer gone", "a.Close: nil", "a.Errors: 0",
		},
	},
	{
		name: "a closes while its Send is blocked for credit",
		run: func(t *testing.T, p *parityPair, l *parityLog) {
			errc := blockedSend(t, p)
			l.err("a.Close", p.a.Close())
			l.err("a.Send blocked", <-errc)
			l.recvAll(p, "b", p.b)
			l.calls(p, "a", p.a)
			l.errors("b", p.b)
		},
		want: []string{
			"a.Close: nil", "a.Send blocked: closed", "b.Recv: EOF",
			"a.Send: closed", "a.Recv: closed", "a.CloseWrite: closed", "a.Close: nil", "a.Errors: 0",
			"b.Errors: 0",
		},
	},
	{
		name: "b closes while a's Send is blocked for credit",
		run: func(t *testing.T, p *parityPair, l *parityLog) {
			errc := blockedSend(t, p)
			l.err("b.Close", p.b.Close())
			l.err("a.Send blocked", <-errc)
			l.calls(p, "a", p.a)
			l.errors("b", p.b)
		},
		want: []string{
			"b.Close: nil", "a.Send blocked: peer gone",
			"a.Send: peer gone", "a.Recv: EOF", "a.CloseWrite: peer gone", "a.Close: nil", "a.Errors: 0",
			"b.Errors: 0",
		},
	},
	{
		name: "b closes, then a dies before its FIN",
		run: func(t *testing.T, p *parityPair, l *parityLog) {
			p.stallA()
			l.err("b.Close", p.b.Close())
			p.killA()
			p.settleB()
			l.calls(p, "b", p.b)
		},
		want: []string{
			"b.Close: nil",
			"b.Send: closed", "b.Recv: closed", "b.CloseWrite: closed", "b.Close: nil", "b.Errors: 0",
		},
	},
	{
		name: "b dies, then a closes",
		run: func(t *testing.T, p *parityPair, l *parityLog) {
			errc := blockedRecv(t, p)
			p.kill()
			l.err("a.Recv blocked", <-errc)
			l.err("a.Close", p.a.Close())
			l.calls(p, "a", p.a)
		},
		want: []string{
			"a.Recv blocked: peer gone", "a.Close: nil",
			"a.Send: peer gone", "a.Recv: peer gone", "a.CloseWrite: peer gone", "a.Close: nil", "a.Errors: 1",
		},
	},
	{
		// After our Close, Send and CloseWrite say ErrClosed where nothing
		// broke the connection before (Close's doc), as Recv does: on RC
		// they said ErrPeerGone after the peer's orderly end (found by
		// TestEndParityRandom).
		name: "b closes, a reads EOF and closes",
		run: func(t *testing.T, p *parityPair, l *parityLog) {
			l.err("b.Close", p.b.Close())
			l.recvAll(p, "a", p.a)
			l.err("a.Close", p.a.Close())
			l.calls(p, "a", p.a)
		},
		want: []string{
			"b.Close: nil", "a.Recv: EOF", "a.Close: nil",
			"a.Send: closed", "a.Recv: closed", "a.CloseWrite: closed", "a.Close: nil", "a.Errors: 0",
		},
	},
	{
		// As above, where the peer died after its FIN, which broke
		// nothing: CloseWrite said ErrPeerGone on RC and on XRC (found by
		// TestEndParityRandom).
		name: "b half-closes and dies, then a closes",
		run: func(t *testing.T, p *parityPair, l *parityLog) {
			l.bHalfClosesAndDies(p)
			l.err("a.Close", p.a.Close())
			l.calls(p, "a", p.a)
		},
		want: []string{
			"b.CloseWrite: nil", "a.Recv: EOF", "a.Send: peer gone", "a.Close: nil",
			"a.Send: closed", "a.Recv: closed", "a.CloseWrite: closed", "a.Close: nil", "a.Errors: 0",
		},
	},
}

// How a connection ends is the same on RC and XRC (cm's promise): each
// scenario runs on both, and gives the same errors (by what they match of
// cm's exported ones) and the same Stats.Errors.
func TestEndParity(t *testing.T) {
	for _, sc := range parityScenarios {
		t.Run(sc.name, func(t *testing.T) {
			got := map[string]parityLog{}
			for _, tr := range parityTransports {
				t.Run(tr.name, func(t *testing.T) {
					var l parityLog
					sc.run(t, tr.pair(t), &l)
					got[tr.name] = l
					require.Equal(t, sc.want, []string(l))
				})
			}
			require.Equal(t, got["RC"], got["XRC"], "RC and XRC differ")
		})
	}
}
