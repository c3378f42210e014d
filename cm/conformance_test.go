package cm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// confClass names what err means to a caller: errClass, plus whether it is
// a net.Error and its Timeout, and whether it matches
// os.ErrDeadlineExceeded (what a passed deadline matches, on Conn and on
// NetConn), ErrNotSupported and ErrInvalid.
func confClass(err error) string {
	if err == nil {
		return "nil"
	}
	s := errClass(err)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		s = "deadline(os)"
		if errors.Is(err, context.DeadlineExceeded) {
			s = "deadline(os+ctx)"
		}
	}
	if errors.Is(err, ErrNotSupported) {
		s = "not supported"
	}
	if errors.Is(err, ErrInvalid) {
		s = "invalid"
	}
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		s += " timeout"
	case errors.As(err, &ne):
	default:
		s += " (not net.Error)"
	}
	return s
}

type confLog []string

func (l *confLog) add(what string, err error) { *l = append(*l, what+": "+confClass(err)) }

func (l *confLog) addN(what string, n int, err error) {
	*l = append(*l, fmt.Sprintf("%s: %d %s", what, n, confClass(err)))
}

// confPair is RC (the fake) or XRC (memfabric) with the same message size
// on both, so that sizes and byte counts compare.
var confTransports = []struct {
	name string
	pair func(*testing.T) *parityPair
}{
	{"RC", rcParityPair},
	{"XRC", func(t *testing.T) *parityPair { return xrcParityPairWith(t, WithMessageSize(256)) }},
}

var confScenarios = []struct {
	name string
	run  func(t *testing.T, p *parityPair, l *confLog)
	want []string
	// per transport where a documented difference makes them differ
	wantRC, wantXRC []string
}{
	{
		name: "zero-length message",
		run: func(t *testing.T, p *parityPair, l *confLog) {
			l.add("a.Send(nil)", p.a.Send(p.ctx, nil))
			l.add("a.Send([]byte{})", p.a.Send(p.ctx, []byte{}))
			n, err := p.b.Recv(p.ctx, nil)
			l.addN("b.Recv(nil)", n, err)
			n, err = p.b.Recv(p.ctx, make([]byte, 8))
			l.addN("b.Recv", n, err)
			s, r := p.a.Stats(), p.b.Stats()
			*l = append(*l, fmt.Sprintf("a sent %d/%dB, b got %d/%dB", s.MessagesSent, s.BytesSent, r.MessagesReceived, r.BytesReceived))
		},
		want: []string{"a.Send(nil): nil", "a.Send([]byte{}): nil", "b.Recv(nil): 0 nil", "b.Recv: 0 nil", "a sent 2/0B, b got 2/0B"},
	},
	{
		name: "maximum, oversize message, short buffer",
		run: func(t *testing.T, p *parityPair, l *confLog) {
			m := p.a.MaxMessageSize()
			*l = append(*l, fmt.Sprintf("MaxMessageSize %d MaxRecvSize %d", m, p.b.MaxRecvSize()))
			l.add("a.Send(max)", p.a.Send(p.ctx, make([]byte, m)))
			l.add("a.Send(max+1)", p.a.Send(p.ctx, make([]byte, m+1)))
			n, err := p.b.Recv(p.ctx, make([]byte, m-1))
			l.addN("b.Recv(max-1 buffer)", n, err)
			n, err = p.b.Recv(p.ctx, make([]byte, p.b.MaxRecvSize()))
			l.addN("b.Recv(MaxRecvSize buffer)", n, err)
			l.add("a.Send", p.a.Send(p.ctx, []byte("x")))
			n, err = p.b.Recv(p.ctx, make([]byte, 8))
			l.addN("b.Recv", n, err)
			*l = append(*l, fmt.Sprintf("Errors a %d b %d", p.a.Stats().Errors, p.b.Stats().Errors))
		},
		want: []string{"MaxMessageSize 256 MaxRecvSize 256", "a.Send(max): nil", "a.Send(max+1): too long",
			"b.Recv(max-1 buffer): 0 too long", "b.Recv(MaxRecvSize buffer): 256 nil", "a.Send: nil", "b.Recv: 1 nil", "Errors a 0 b 0"},
	},
	{
		name: "deadlines past and future, cancel",
		run: func(t *testing.T, p *parityPair, l *confLog) {
			past, cancel := context.WithDeadline(p.ctx, time.Now().Add(-time.Second))
			defer cancel()
			l.add("a.Send(past)", p.a.Send(past, []byte("x")))
			require.NoError(t, p.b.Send(p.ctx, []byte("y")))
			_, err := p.a.Recv(past, make([]byte, 8))
			l.add("a.Recv(past), a message waiting", err)
			n, err := p.a.Recv(p.ctx, make([]byte, 8))
			l.addN("a.Recv", n, err)
			short, cancel2 := context.WithTimeout(p.ctx, 5*time.Millisecond)
			defer cancel2()
			_, err = p.a.Recv(short, make([]byte, 8))
			l.add("a.Recv(5ms)", err)
			ended, cancel3 := context.WithCancel(p.ctx)
			cancel3()
			l.add("a.Send(canceled)", p.a.Send(ended, []byte("x")))
			l.add("a.Send(max+1, past)", p.a.Send(past, make([]byte, 257)))
			l.add("a.CloseWrite", p.a.CloseWrite())
			l.add("a.Send(max+1) after CloseWrite", p.a.Send(p.ctx, make([]byte, 257)))
			*l = append(*l, fmt.Sprintf("Errors a %d", p.a.Stats().Errors))
		},
		want: []string{"a.Send(past): deadline(os+ctx) timeout", "a.Recv(past), a message waiting: deadline(os+ctx) timeout",
			"a.Recv: 1 nil", "a.Recv(5ms): deadline(os+ctx) timeout", "a.Send(canceled): canceled",
			"a.Send(max+1, past): deadline(os+ctx) timeout", "a.CloseWrite: nil", "a.Send(max+1) after CloseWrite: closed", "Errors a 0"},
	},
	{
		name: "NetConn: deadlines, stream chunks, Close racing a blocked Read",
		run: func(t *testing.T, p *parityPair, l *confLog) {
			na, nb := p.a.NetConn(), p.b.NetConn()
			require.NoError(t, na.SetReadDeadline(time.Now().Add(-time.Second)))
			_, err := na.Read(make([]byte, 8))
			l.add("Read, deadline past", err)
			require.NoError(t, na.SetReadDeadline(time.Now().Add(10*time.Millisecond)))
			_, err = na.Read(make([]byte, 8))
			l.add("Read, deadline 10ms", err)
			require.NoError(t, na.SetReadDeadline(time.Time{}))
			errc := make(chan error, 1)
			go func() { _, err := na.Read(make([]byte, 8)); errc <- err }()
			waitParked(t, "cm.(*Conn).Recv")
			require.NoError(t, na.SetReadDeadline(time.Now()))
			l.add("blocked Read, deadline set to now", <-errc)
			require.NoError(t, na.SetReadDeadline(time.Time{}))
			n, err := nb.Write([]byte("hello world"))
			l.addN("Write", n, err)
			n, err = na.Read(make([]byte, 4))
			l.addN("Read(4)", n, err)
			n, err = na.Read(make([]byte, 40))
			l.addN("Read(40)", n, err)
			big := make([]byte, 3*256+5)
			got := make(chan int, 1)
			go func() {
				k, buf := 0, make([]byte, 100)
				for k < len(big) {
					n, err := na.Read(buf)
					if err != nil {
						break
					}
					k += n
				}
				got <- k
			}()
			n, err = nb.Write(big)
			l.addN("Write(3*max+5)", n, err)
			*l = append(*l, fmt.Sprintf("read %d", <-got))
			s := p.b.Stats()
			*l = append(*l, fmt.Sprintf("b sent %d/%dB", s.MessagesSent, s.BytesSent))
			require.NoError(t, nb.SetWriteDeadline(time.Now().Add(-time.Second)))
			n, err = nb.Write(nil)
			l.addN("Write(nil), deadline past", n, err)
			go func() { _, err := na.Read(make([]byte, 8)); errc <- err }()
			waitParked(t, "cm.(*Conn).Recv")
			l.add("a Close", na.Close())
			l.add("blocked Read after Close", <-errc)
			_, err = na.Read(make([]byte, 8))
			l.add("Read after Close", err)
			_, err = na.Write([]byte("x"))
			l.add("Write after Close", err)
			l.add("SetDeadline after Close", na.SetDeadline(time.Now()))
			_, err = nb.Read(make([]byte, 8))
			l.add("b Read", err)
		},
		want: []string{"Read, deadline past: deadline(os) timeout", "Read, deadline 10ms: deadline(os) timeout",
			"blocked Read, deadline set to now: deadline(os) timeout", "Write: 11 nil", "Read(4): 4 nil", "Read(40): 7 nil",
			"Write(3*max+5): 773 nil", "read 773", "b sent 5/784B", "Write(nil), deadline past: 0 deadline(os) timeout",
			"a Close: nil", "blocked Read after Close: closed", "Read after Close: closed", "Write after Close: closed",
			"SetDeadline after Close: closed", "b Read: EOF (not net.Error)"},
	},
	{
		name: "peer half-closed",
		run: func(t *testing.T, p *parityPair, l *confLog) {
			errc := make(chan error, 2)
			for range 2 {
				go func() { _, err := p.a.Recv(p.ctx, make([]byte, 8)); errc <- err }()
			}
			waitParkedN(t, "cm.(*Conn).Recv", 1)
			l.add("b.CloseWrite", p.b.CloseWrite())
			l.add("a's blocked Recv", <-errc)
			l.add("a's other blocked Recv", <-errc)
			_, err := p.a.Recv(p.ctx, make([]byte, 8))
			l.add("a.Recv", err)
			l.add("a.Send", p.a.Send(p.ctx, []byte("x")))
			n, err := p.b.Recv(p.ctx, make([]byte, 8))
			l.addN("b.Recv", n, err)
			l.add("b.Send", p.b.Send(p.ctx, []byte("x")))
			l.add("b.CloseWrite again", p.b.CloseWrite())
			l.add("a.CloseWrite", p.a.CloseWrite())
			_, err = p.b.Recv(p.ctx, make([]byte, 8))
			l.add("b.Recv", err)
			l.add("a.Close", p.a.Close())
			l.add("b.Close", p.b.Close())
			l.add("b.CloseWrite after Close", p.b.CloseWrite())
			*l = append(*l, fmt.Sprintf("Errors a %d b %d", p.a.Stats().Errors, p.b.Stats().Errors))
		},
		want: []string{"b.CloseWrite: nil", "a's blocked Recv: EOF (not net.Error)", "a's other blocked Recv: EOF (not net.Error)",
			"a.Recv: EOF (not net.Error)", "a.Send: nil", "b.Recv: 1 nil", "b.Send: closed", "b.CloseWrite again: nil",
			"a.CloseWrite: nil", "b.Recv: EOF (not net.Error)", "a.Close: nil", "b.Close: nil", "b.CloseWrite after Close: closed",
			"Errors a 0 b 0"},
	},
	{
		name: "peer killed with a message unread, short buffer",
		run: func(t *testing.T, p *parityPair, l *confLog) {
			require.NoError(t, p.b.Send(p.ctx, []byte("0123456789")))
			_, err := p.a.Recv(p.ctx, make([]byte, 4)) // the message is in
			l.add("a.Recv(4)", err)
			p.kill()
			p.settle()
			_, err = p.a.Recv(p.ctx, make([]byte, 4))
			l.add("a.Recv(4) after the death", err)
			n, err := p.a.Recv(p.ctx, make([]byte, 40))
			l.addN("a.Recv(40)", n, err)
			_, err = p.a.Recv(p.ctx, make([]byte, 40))
			l.add("a.Recv", err)
			l.add("a.Send(max+1)", p.a.Send(p.ctx, make([]byte, 257)))
			l.add("a.Send", p.a.Send(p.ctx, []byte("x")))
			l.add("a.CloseWrite", p.a.CloseWrite())
			l.add("a.Close", p.a.Close())
			l.add("a.Send(max+1) after Close", p.a.Send(p.ctx, make([]byte, 257)))
			*l = append(*l, fmt.Sprintf("Errors a %d", p.a.Stats().Errors))
		},
		want: []string{"a.Recv(4): too long", "a.Recv(4) after the death: too long", "a.Recv(40): 10 nil", "a.Recv: peer gone",
			"a.Send(max+1): too long", "a.Send: peer gone", "a.CloseWrite: peer gone", "a.Close: nil",
			"a.Send(max+1) after Close: peer gone", "Errors a 1"},
	},
	{
		name: "own Close racing blocked Recvs and Sends",
		run: func(t *testing.T, p *parityPair, l *confLog) {
			fillCredits(t, p)
			errc := make(chan error, 4)
			for range 2 {
				go func() { _, err := p.a.Recv(p.ctx, make([]byte, 8)); errc <- err }()
				go func() { errc <- p.a.Send(p.ctx, []byte("no credit")) }()
			}
			waitParkedN(t, "cm.(*Conn).Recv", 1)
			waitParkedN(t, "cm.(*Conn).Send", 1)
			l.add("a.Close", p.a.Close())
			for range 4 {
				l.add("blocked call", <-errc)
			}
			n := 0
			for {
				if _, err := p.b.Recv(p.ctx, make([]byte, 64)); err != nil {
					l.addN("b read then", n, err)
					break
				}
				n++
			}
			*l = append(*l, fmt.Sprintf("Errors a %d b %d", p.a.Stats().Errors, p.b.Stats().Errors))
		},
		want: []string{"a.Close: nil", "blocked call: closed", "blocked call: closed", "blocked call: closed", "blocked call: closed",
			"b read then: 4 EOF (not net.Error)", "Errors a 0 b 0"},
	},
	{
		// One-sided RDMA and immediate data are RC only (doc.go,
		// "Transports"): ErrNotSupported over XRC.
		name: "one-sided RDMA and immediate data",
		run: func(t *testing.T, p *parityPair, l *confLog) {
			r, err := p.a.RegisterMemory(64, RemoteRead|RemoteWrite)
			l.add("RegisterMemory", err)
			if r != nil {
				require.NoError(t, r.Close())
			}
			l.add("SendWithImm", p.a.SendWithImm(p.ctx, []byte("x"), 7))
			l.add("SendWithImm(max+1)", p.a.SendWithImm(p.ctx, make([]byte, 257), 7))
			require.NoError(t, p.a.Close())
			l.add("SendWithImm after Close", p.a.SendWithImm(p.ctx, []byte("x"), 7))
		},
		wantRC: []string{"RegisterMemory: nil", "SendWithImm: nil", "SendWithImm(max+1): too long", "SendWithImm after Close: closed"},
		wantXRC: []string{"RegisterMemory: not supported", "SendWithImm: not supported", "SendWithImm(max+1): too long",
			"SendWithImm after Close: closed"},
	},
	{
		// The peer's Close after a's io.EOF: on RC a has its FIN (the
		// data path) before the CM's word of the disconnect, and a FIN
		// does not say Close from CloseWrite, so Send and CloseWrite
		// go (nil; the message is lost, as a TCP write after the peer's
		// close is); over XRC the FIN of a Close is the peer's end and
		// closes a's side, so both say ErrPeerGone at once. After the
		// word, RC says what XRC said (CloseWrite's doc).
		name: "peer closed, a read io.EOF, the CM's word not yet in",
		run: func(t *testing.T, p *parityPair, l *confLog) {
			release := func() {}
			if _, ok := p.a.t.(*fakeEnd); ok {
				release = p.holdA()
			}
			l.add("b.Close", p.b.Close())
			_, err := p.a.Recv(p.ctx, make([]byte, 8))
			l.add("a.Recv", err)
			l.add("a.Send", p.a.Send(p.ctx, []byte("x")))
			release()
			p.settle()
			l.add("a.Send after the word", p.a.Send(p.ctx, []byte("x")))
			l.add("a.CloseWrite after the word", p.a.CloseWrite())
			l.add("a.Close", p.a.Close())
			*l = append(*l, fmt.Sprintf("Errors a %d", p.a.Stats().Errors))
		},
		wantRC: []string{"b.Close: nil", "a.Recv: EOF (not net.Error)", "a.Send: nil", "a.Send after the word: peer gone",
			"a.CloseWrite after the word: peer gone", "a.Close: nil", "Errors a 0"},
		wantXRC: []string{"b.Close: nil", "a.Recv: EOF (not net.Error)", "a.Send: peer gone", "a.Send after the word: peer gone",
			"a.CloseWrite after the word: peer gone", "a.Close: nil", "Errors a 0"},
	},
}

// TestConformance runs each situation on RC (the fake transport) and over
// XRC (memfabric) and compares what a user sees: errors by what they match
// (errors.Is against cm's sentinels, io.EOF, the deadline errors), whether
// they are net.Errors and Timeouts, byte counts and Stats. Where doc.go
// states a difference, the scenario pins each side.
func TestConformance(t *testing.T) {
	for _, sc := range confScenarios {
		t.Run(sc.name, func(t *testing.T) {
			got := map[string][]string{}
			for _, tr := range confTransports {
				t.Run(tr.name, func(t *testing.T) {
					var l confLog
					sc.run(t, tr.pair(t), &l)
					got[tr.name] = l
					want := sc.want
					if want == nil {
						want = map[string][]string{"RC": sc.wantRC, "XRC": sc.wantXRC}[tr.name]
					}
					require.Equal(t, want, []string(l))
				})
			}
			if sc.want != nil {
				require.Equal(t, got["RC"], got["XRC"], "RC and XRC differ")
			}
		})
	}
}

// Listener.Close with an Accept pending, and Accept after Close: RC's
// listener is built as TestAcceptWithEndedContextSaysSo builds it (no CM
// here), XRC's is a memfabric one.
func TestConformanceListener(t *testing.T) {
	run := func(t *testing.T, l *Listener) []string {
		var log confLog
		ctx := ctxT(t)
		errc := make(chan error, 1)
		go func() { _, err := l.Accept(ctx); errc <- err }()
		waitParked(t, "cm.(*Listener).Accept")
		log.add("Close", l.Close())
		log.add("pending Accept", <-errc)
		_, err := l.Accept(ctx)
		log.add("Accept after Close", err)
		ended, cancel := context.WithCancel(ctx)
		cancel()
		_, err = l.Accept(ended)
		log.add("Accept after Close, ctx ended", err)
		_, err = l.NetListener().Accept()
		log.add("NetListener Accept after Close", err)
		log.add("Close again", l.Close())
		return log
	}
	want := []string{"Close: nil", "pending Accept: closed", "Accept after Close: closed", "Accept after Close, ctx ended: closed",
		"NetListener Accept after Close: closed", "Close again: nil"}
	t.Run("RC", func(t *testing.T) {
		l := &Listener{ch: &chanRef{refs: 2}, ready: make(chan *Conn, 1), done: make(chan struct{}), inProgress: make(chan struct{}, 1)}
		require.Equal(t, want, run(t, l))
	})
	t.Run("XRC", func(t *testing.T) {
		f := newFabric(t)
		l, err := Listen(ctxT(t), "10.1.7.1:0", WithFabric(f.Node("10.1.7.1").Process()), WithDomainPath(filepath.Join(t.TempDir(), "xrc")))
		require.NoError(t, err)
		require.Equal(t, want, run(t, l))
	})
}
