//go:build linux && cgo

package integration

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/cm"
	"github.com/goxrc/goxrc/rdmacm"
	"github.com/goxrc/goxrc/test/softroce"
	"github.com/goxrc/goxrc/verbs"
)

// The kill tests re-execute this test binary as a separate process (the
// victim) that the test SIGKILLs: GOXRC_CM_VICTIM=server listens on
// GOXRC_CM_VICTIM_ADDR and echoes; =client dials it and streams;
// =acceptor accepts connections at the default sizes and echoes each, for
// tests of a process that only dials.
const victimEnv, victimAddrEnv = "GOXRC_CM_VICTIM", "GOXRC_CM_VICTIM_ADDR"

func init() {
	role := os.Getenv(victimEnv)
	if role == "" {
		return
	}
	err := runVictim(role, os.Getenv(victimAddrEnv))
	fmt.Fprintln(os.Stderr, "victim:", err)
	os.Exit(3)
}

func runVictim(role, addr string) error {
	ctx := context.Background()
	buf := make([]byte, 4096)
	switch role {
	case "server":
		l, err := cm.Listen(ctx, addr, cm.WithMessageSize(4096), cm.WithQueueDepth(16))
		if err != nil {
			return err
		}
		fmt.Printf("ready %s\n", l.Addr())
		c, err := l.Accept(ctx)
		if err != nil {
			return err
		}
		return echo(ctx, c, buf)
	case "acceptor":
		l, err := cm.Listen(ctx, addr)
		if err != nil {
			return err
		}
		fmt.Printf("ready %s\n", l.Addr())
		for {
			c, err := l.Accept(ctx)
			if err != nil {
				return err
			}
			go func() {
				echo(ctx, c, make([]byte, cm.DefaultMessageSize))
				c.Close()
			}()
		}
	case "holder":
		// Accepts and holds every connection: never reads, never closes.
		l, err := cm.Listen(ctx, addr)
		if err != nil {
			return err
		}
		fmt.Printf("ready %s\n", l.Addr())
		var held []*cm.Conn
		for {
			c, err := l.Accept(ctx)
			if err != nil {
				return err
			}
			held = append(held, c)
		}
	case "client":
		c, err := cm.Dial(ctx, addr, cm.WithMessageSize(4096), cm.WithQueueDepth(16))
		if err != nil {
			return err
		}
		fmt.Println("ready")
		for {
			if err := c.Send(ctx, buf[:1024]); err != nil {
				return err
			}
		}
	}
	return fmt.Errorf("unknown role %q", role)
}

// echo sends back every message c receives until it fails.
func echo(ctx context.Context, c *cm.Conn, buf []byte) error {
	for {
		n, err := c.Recv(ctx, buf)
		if err != nil {
			return err
		}
		if err := c.Send(ctx, buf[:n]); err != nil {
			return err
		}
	}
}

// startVictim starts the victim and returns it with the first word after
// "ready" on its stdout.
func startVictim(t testing.TB, role, addr string) (*exec.Cmd, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), victimEnv+"="+role, victimAddrEnv+"="+addr)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(out).ReadString('\n')
		line <- s
		io.Copy(io.Discard, out)
	}()
	select {
	case s := <-line:
		f := strings.Fields(s)
		require.True(t, len(f) >= 1 && f[0] == "ready", "victim said %q", s)
		if len(f) > 1 {
			return cmd, f[1]
		}
		return cmd, ""
	case <-time.After(30 * time.Second):
		t.Fatal("victim did not get ready")
	}
	return nil, ""
}

func requirePeerGone(t *testing.T, what string, err error) {
	t.Helper()
	require.Error(t, err, what)
	require.ErrorIs(t, err, cm.ErrPeerGone, "%s: %v", what, err)
}

func TestCMServerKilled(t *testing.T) {
	dev, ip := softroce.Device(t)
	base := baseline(t, dev)
	victim, addr := startVictim(t, "server", netip.AddrPortFrom(ip, 0).String())
	ctx := cmCtx(t, 60*time.Second)
	client, err := cm.Dial(ctx, addr, cm.WithMessageSize(4096), cm.WithQueueDepth(16), cm.WithHandshakeTimeout(5*time.Second))
	require.NoError(t, err)
	t.Cleanup(func() { client.Close() }) // a failure must not leave it to the leak checks of later tests
	sendErr, recvErr := make(chan error, 1), make(chan error, 1)
	echoed := make(chan struct{})
	go func() {
		msg := make([]byte, 2048)
		for {
			if err := client.Send(ctx, msg); err != nil {
				sendErr <- err
				return
			}
		}
	}()
	go func() {
		buf := make([]byte, 4096)
		for i := 1; ; i++ {
			if _, err := client.Recv(ctx, buf); err != nil {
				recvErr <- err
				return
			}
			if i == 100 {
				close(echoed)
			}
		}
	}()
	select {
	case <-echoed:
	case err := <-recvErr:
		t.Fatalf("before the kill: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("no echoes")
	}
	require.NoError(t, victim.Process.Signal(syscall.SIGKILL))
	killed := time.Now()
	for _, c := range []struct {
		what string
		ch   chan error
	}{{"Send", sendErr}, {"Recv", recvErr}} {
		select {
		case err := <-c.ch:
			t.Logf("%s after %v: %v", c.what, time.Since(killed).Round(time.Millisecond), err)
			requirePeerGone(t, c.what, err)
			require.False(t, errors.Is(err, context.DeadlineExceeded), "%s ran into the test's deadline", c.what)
		case <-time.After(20 * time.Second):
			t.Fatalf("%s still blocked 20 s after the server was killed", c.what)
		}
	}
	start := time.Now()
	require.NoError(t, client.Close())
	t.Logf("Close took %v", time.Since(start).Round(time.Millisecond))
	victim.Wait()
	waitObjects(t, base, 10*time.Second)
}

func TestCMClientKilled(t *testing.T) {
	dev, _ := softroce.Device(t)
	base := baseline(t, dev)
	l, addr := cmListen(t, cm.WithMessageSize(4096), cm.WithQueueDepth(16))
	victim, _ := startVictim(t, "client", addr)
	ctx := cmCtx(t, 60*time.Second)
	server, err := l.Accept(ctx)
	require.NoError(t, err)
	t.Cleanup(func() { server.Close() }) // a failure must not leave it to the leak checks of later tests
	require.Equal(t, base.cm.ConnectionsOpen+1, cm.GlobalStats().ConnectionsOpen)
	buf := make([]byte, 4096)
	for i := 0; i < 100; i++ {
		_, err := server.Recv(ctx, buf)
		require.NoError(t, err)
	}
	require.NoError(t, victim.Process.Signal(syscall.SIGKILL))
	killed := time.Now()
	errc := make(chan error, 1)
	go func() {
		for {
			if _, err := server.Recv(ctx, buf); err != nil {
				errc <- err
				return
			}
		}
	}()
	select {
	case err := <-errc:
		t.Logf("Recv after %v: %v", time.Since(killed).Round(time.Millisecond), err)
		requirePeerGone(t, "Recv", err)
	case <-time.After(20 * time.Second):
		t.Fatal("Recv still blocked 20 s after the client was killed")
	}
	requirePeerGone(t, "Send after the loss", server.Send(ctx, []byte("anyone?")))
	require.NoError(t, server.Close())
	require.NoError(t, l.Close())
	victim.Wait()
	waitObjects(t, base, 10*time.Second)
}

// goxrcHello is a valid goxrc dialer hello (see cm/hello.go), built by hand:
// version 2, with a keepalive target of address 0 and rkey 0 (a listener
// without WithKeepalive never reads it).
func goxrcHello(depth uint16, maxMsg uint32) []byte {
	b := make([]byte, 28)
	copy(b, "GXRC")
	b[4], b[5] = 2, 28
	binary.BigEndian.PutUint16(b[8:], depth)
	binary.BigEndian.PutUint32(b[12:], maxMsg)
	return b
}

// rawConnect sends a connection request with private data pd from a bare
// rdmacm id and returns the id with the first answer: the CONNECT_RESPONSE,
// or the error of a rejection.
func rawConnect(t *testing.T, ch *rdmacm.EventChannel, addr string, pd []byte) (*rdmacm.ID, rdmacm.Event, error) {
	return rawConnectWith(t, ch, addr, rdmacm.ConnParam{PrivateData: pd, ResponderResources: 1, InitiatorDepth: 1})
}

// rawConnectWith is rawConnect with the request's parameters (its QP number
// and retry counts are filled in).
func rawConnectWith(t *testing.T, ch *rdmacm.EventChannel, addr string, cp rdmacm.ConnParam) (*rdmacm.ID, rdmacm.Event, error) {
	t.Helper()
	ctx := cmCtx(t, 10*time.Second)
	id, err := ch.CreateID(rdmacm.PortSpaceTCP, verbs.QPTypeRC)
	require.NoError(t, err)
	t.Cleanup(func() { id.Close() }) // the caller closes it; this on a failure
	require.NoError(t, id.ResolveAddr(ctx, netip.AddrPort{}, netip.MustParseAddrPort(addr)))
	require.NoError(t, id.ResolveRoute(ctx))
	cp.QPNum, cp.RetryCount, cp.RNRRetryCount = rdmacmNextQPN(), 7, 7
	require.NoError(t, id.Connect(cp))
	ev, err := id.WaitEvent(ctx, rdmacm.EventConnectResponse)
	return id, ev, err
}

// A framed peer must let us read its memory: with no responder resources
// (read credit) for us, a keepalive probe or a ReadRemote would wait for
// ever, and every send behind it. The listener refuses such a request; one
// whose peer will not read ours (initiator depth 0) is fine. It grants the
// request's reads up to one each way, and its QP holds what it granted.
func TestCMHandshakeGrantsReads(t *testing.T) {
	dev, _ := softroce.Device(t)
	base := baseline(t, dev)
	l, addr := cmListen(t)
	ch, err := rdmacm.NewEventChannel()
	require.NoError(t, err)
	t.Cleanup(func() { ch.Close() }) // closed below; this on a failure
	before := cm.GlobalStats().AcceptErrors
	id, _, err := rawConnectWith(t, ch, addr, rdmacm.ConnParam{PrivateData: goxrcHello(8, 4096), InitiatorDepth: 1})
	var re *rdmacm.RejectError
	require.ErrorAs(t, err, &re, "a request that grants no reads")
	require.Equal(t, before+1, cm.GlobalStats().AcceptErrors)
	require.NoError(t, id.Close())
	// serve and issue: the reads the requester offers to serve and asks
	// to issue; the reply's values as the CM reports them to the
	// requester: the reads it serves (ResponderResources, the listener's
	// initiator depth) and may issue (InitiatorDepth).
	for _, c := range []struct{ serve, issue, wantServe, wantIssue uint8 }{
		{serve: 1, issue: 0, wantServe: 1, wantIssue: 0},
		{serve: 4, issue: 4, wantServe: 1, wantIssue: 1},
	} {
		id, ev, err := rawConnectWith(t, ch, addr, rdmacm.ConnParam{PrivateData: goxrcHello(8, 4096), ResponderResources: c.serve, InitiatorDepth: c.issue})
		require.NoError(t, err, "%+v", c)
		require.Equal(t, "GXRC", string(ev.PrivateData[:4]))
		require.Equal(t, c.wantIssue, ev.Conn.InitiatorDepth, "reads granted to the requester, %+v", c)
		require.Equal(t, c.wantServe, ev.Conn.ResponderResources, "reads the listener will issue, %+v", c)
		require.NoError(t, id.Reject(nil))
		require.NoError(t, id.Close())
	}
	require.NoError(t, ch.Close())
	require.NoError(t, l.Close())
	waitObjects(t, base, 10*time.Second)
}

// The dialing side checks the acceptor's answer as the listener checks the
// request: a hello that is not goxrc's, or an answer that grants no reads,
// fails the Dial with ErrProtocol, the acceptor is rejected (it must not wait
// for an RTU), and the Dial leaves nothing behind.
func TestCMDialRefusesBadAnswers(t *testing.T) {
	dev, ip := softroce.Device(t)
	ch := rdmacmChannel(t)
	l := rdmacmListen(t, ch, rdmacm.PortSpaceTCP, verbs.QPTypeRC, netip.AddrPortFrom(ip, 0))
	base := baseline(t, dev)
	// After ctx's cancel (cleanups run last first): the acceptor of a
	// failed round closes its id within this test.
	var answering sync.WaitGroup
	t.Cleanup(answering.Wait)
	ctx := cmCtx(t, 60*time.Second)
	good := rdmacm.ConnParam{PrivateData: goxrcHello(8, 4096), ResponderResources: 1, InitiatorDepth: 1, RNRRetryCount: 7}
	with := func(edit func(cp *rdmacm.ConnParam)) rdmacm.ConnParam {
		cp := good
		cp.PrivateData = bytes.Clone(cp.PrivateData)
		edit(&cp)
		return cp
	}
	for _, c := range []struct {
		name   string
		answer rdmacm.ConnParam
		want   string
	}{
		{"grants no reads", with(func(cp *rdmacm.ConnParam) { cp.ResponderResources = 0 }), "no RDMA reads"},
		{"no hello (a raw listener)", with(func(cp *rdmacm.ConnParam) { cp.PrivateData = nil }), "magic"},
		{"version 1", with(func(cp *rdmacm.ConnParam) {
			cp.PrivateData[4], cp.PrivateData[5] = 1, 16
			cp.PrivateData = cp.PrivateData[:16]
		}), "version 1"},
		// The CM pads private data with zeros: a short hello reads as one
		// whose fields past its end are 0.
		{"short", with(func(cp *rdmacm.ConnParam) { cp.PrivateData = cp.PrivateData[:12] }), "message size 0"},
		{"queue depth 65535", with(func(cp *rdmacm.ConnParam) { cp.PrivateData = goxrcHello(0xffff, 4096) }), "queue depth"},
	} {
		answered := make(chan rdmacm.EventType, 1)
		answering.Go(func() {
			ev, err := l.WaitEvent(ctx, rdmacm.EventConnectRequest)
			if err != nil {
				answered <- -1
				return
			}
			defer ev.ID.Close()
			cp := c.answer
			cp.QPNum = rdmacmNextQPN()
			if err := ev.ID.Accept(cp); err != nil {
				answered <- -1
				return
			}
			got, _ := ev.ID.Event(ctx) // the dialer's reject
			answered <- got.Type
		})
		conn, err := cm.Dial(ctx, netip.AddrPortFrom(ip, l.LocalAddr().Port()).String())
		require.Nil(t, conn, c.name)
		require.ErrorIs(t, err, cm.ErrProtocol, c.name)
		require.ErrorContains(t, err, c.want, c.name)
		require.Equal(t, rdmacm.EventRejected, <-answered, "%s: the acceptor is told", c.name)
	}
	waitObjects(t, base, 10*time.Second)
}

func TestCMHandshakeNeverCompleted(t *testing.T) {
	dev, _ := softroce.Device(t)
	base := baseline(t, dev)
	l, addr := cmListen(t, cm.WithHandshakeTimeout(2*time.Second))
	before := cm.GlobalStats().AcceptErrors
	ch, err := rdmacm.NewEventChannel()
	require.NoError(t, err)
	t.Cleanup(func() { ch.Close() }) // closed below; this on a failure
	id, ev, err := rawConnect(t, ch, addr, goxrcHello(8, 4096))
	require.NoError(t, err, "the listener should answer a valid hello")
	require.GreaterOrEqual(t, len(ev.PrivateData), 16)
	require.Equal(t, "GXRC", string(ev.PrivateData[:4]))
	// No Establish: the acceptor waits for an RTU that never comes.
	start := time.Now()
	c, err := l.Accept(cmCtx(t, 4*time.Second))
	require.Nil(t, c, "Accept returned a connection whose handshake never completed")
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Eventually(t, func() bool { return cm.GlobalStats().AcceptErrors == before+1 }, 5*time.Second, 20*time.Millisecond,
		"the listener did not give up on the handshake")
	t.Logf("handshake given up within %v", time.Since(start).Round(time.Millisecond))
	// What the abandoned dialer hears (the acceptor destroyed its id).
	if ev, err := id.Event(cmCtx(t, 2*time.Second)); err == nil {
		t.Logf("dialer got %v", ev.Type)
	}
	require.NoError(t, id.Close())
	require.NoError(t, ch.Close())
	require.Equal(t, base.cm.ConnectionsOpen, cm.GlobalStats().ConnectionsOpen)
	require.Equal(t, base.cm.QueuePairs, cm.GlobalStats().QueuePairs)

	// The listener still serves proper dialers. The acceptor is waited
	// for after ctx's cancel (cleanups run last first): on a failure its
	// connection closes within this test.
	var accepting sync.WaitGroup
	t.Cleanup(accepting.Wait)
	ctx := cmCtx(t, 20*time.Second)
	accepting.Go(func() {
		if c, err := l.Accept(ctx); err == nil {
			c.Close()
		}
	})
	c2, err := cm.Dial(ctx, addr)
	require.NoError(t, err)
	require.NoError(t, c2.Close())
	require.NoError(t, l.Close())
	waitObjects(t, base, 10*time.Second)
}

// TestCMAcceptorGoneBeforeRTU: an acceptor that destroys its id right after
// its REP (a listener closed, or one whose handshake timed out, before our
// RTU arrived) makes its CM reject us. Whichever side of our RTU the reject
// lands on, the Dial fails with the reject, or the Conn it returned fails
// at once and closes without waiting out the handshake timeout. (The
// reject that crossed our RTU was ignored: the Conn looked healthy, a Recv
// on it waited for ever, and its Close for the handshake timeout.)
func TestCMAcceptorGoneBeforeRTU(t *testing.T) {
	dev, addr := softroce.Device(t)
	ch := rdmacmChannel(t)
	l := rdmacmListen(t, ch, rdmacm.PortSpaceTCP, verbs.QPTypeRC, netip.AddrPortFrom(addr, 0))
	base := baseline(t, dev) // the listener's id and channel close at the end
	// After ctx's cancel (cleanups run last first): on a failure the
	// acceptor's ids close within this test.
	var serving sync.WaitGroup
	t.Cleanup(serving.Wait)
	ctx := cmCtx(t, 60*time.Second)
	// The acceptor waits a little longer each round, so that its reject
	// lands before our QP reaches RTS, between that and our RTU, or (its
	// CM saw the RTU) becomes a plain disconnect.
	const rounds = 12
	delay := func(i int) time.Duration { return time.Duration(i) * 200 * time.Microsecond }
	served := make(chan error, 1)
	serving.Go(func() {
		for i := range rounds {
			ev, err := l.WaitEvent(ctx, rdmacm.EventConnectRequest)
			if err != nil {
				served <- err
				return
			}
			err = ev.ID.Accept(rdmacm.ConnParam{QPNum: rdmacmNextQPN(), PrivateData: goxrcHello(8, 4096),
				ResponderResources: 1, InitiatorDepth: 1, RNRRetryCount: 7})
			time.Sleep(delay(i))
			if cerr := ev.ID.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				served <- err
				return
			}
		}
		served <- nil
	})
	var closing sync.WaitGroup // each Close waits out a time-wait (2 s) where there is one
	defer closing.Wait()       // also on a failure: the Closes report to t
	for i := range rounds {
		c, err := cm.Dial(ctx, l.LocalAddr().String(), cm.WithHandshakeTimeout(20*time.Second))
		if err != nil {
			var re *rdmacm.RejectError
			require.ErrorAs(t, err, &re, "round %d: the Dial's error should be the reject", i)
			t.Logf("round %d (acceptor gone after %v): Dial failed: %v", i, delay(i), err)
			continue
		}
		defer c.Close() // closed in the background below; this on a failure
		_, err = c.Recv(cmCtx(t, 5*time.Second), make([]byte, 64))
		require.ErrorIs(t, err, cm.ErrPeerGone, "round %d: Recv on a connection the acceptor abandoned", i)
		closing.Go(func() {
			start := time.Now()
			cerr := c.Close()
			took := time.Since(start)
			t.Logf("round %d (acceptor gone after %v): connected, then %v; Close took %v", i, delay(i), err, took.Round(time.Millisecond))
			if cerr != nil || took > 10*time.Second {
				t.Errorf("round %d: Close took %v (the handshake timeout is 20s): %v", i, took, cerr)
			}
		})
	}
	closing.Wait()
	require.NoError(t, <-served)
	waitObjects(t, base, 10*time.Second)
}

// TestCMHelloCannotChooseOurMemory: a dialer's hello claiming the largest
// queue depth (4000) and 1 MiB messages must not make the listener register
// 4001 send buffers of its own message size (262 MB at the default 64 KiB),
// pinned until the handshake timeout for a dialer that never completes: the
// listener sends at most its own depth, so it registers about 4 MB.
func TestCMHelloCannotChooseOurMemory(t *testing.T) {
	dev, _ := softroce.Device(t)
	base := baseline(t, dev)
	l, addr := cmListen(t, cm.WithHandshakeTimeout(3*time.Second))
	ch, err := rdmacm.NewEventChannel()
	require.NoError(t, err)
	t.Cleanup(func() { ch.Close() })
	before := registeredBytes(t)
	id, ev, err := rawConnect(t, ch, addr, goxrcHello(4000, 1<<20))
	t.Cleanup(func() { id.Close() })
	require.NoError(t, err, "the listener should answer a valid hello")
	require.Equal(t, "GXRC", string(ev.PrivateData[:4]))
	grown := registeredBytes(t) - before // the pending connection's buffers
	t.Logf("memory registered for the pending connection: %d bytes", grown)
	require.Less(t, grown, int64(16<<20), "the peer's hello chose how much memory the listener pins")
	require.NoError(t, id.Close())
	require.NoError(t, ch.Close())
	require.NoError(t, l.Close())
	waitObjects(t, base, 10*time.Second)
}

// registeredBytes is this process's pinned memory (VmPin in
// /proc/self/status): registering memory pins it.
func registeredBytes(t *testing.T) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	require.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmPin:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			require.NoError(t, err, "%q", line)
			return kb << 10
		}
	}
	t.Fatal("no VmPin in /proc/self/status")
	return 0
}

func TestCMGarbageHandshake(t *testing.T) {
	dev, _ := softroce.Device(t)
	base := baseline(t, dev)
	l, addr := cmListen(t)
	hello := func(edit func(b []byte) []byte) []byte { return edit(goxrcHello(8, 4096)) }
	for _, c := range []struct {
		name string
		pd   []byte
	}{
		{"http", []byte("GET / HTTP/1.1\r\n")},
		{"none (a raw-mode peer)", nil},
		{"bad magic", hello(func(b []byte) []byte { b[0] = 'X'; return b })},
		{"version 7", hello(func(b []byte) []byte { b[4] = 7; return b })},
		{"version 1", hello(func(b []byte) []byte { b[4], b[5] = 1, 16; return b[:16] })},
		{"keepalive target wraps", hello(func(b []byte) []byte { copy(b[16:24], bytes.Repeat([]byte{0xff}, 8)); return b })},
		{"wrong length", hello(func(b []byte) []byte { b[5] = 200; return b })},
		{"reserved flags", hello(func(b []byte) []byte { b[6] = 1; return b })},
		{"reserved field", hello(func(b []byte) []byte { b[10] = 0xff; return b })},
		{"garbage after the hello", hello(func(b []byte) []byte { return append(b, 'x') })},
		{"short", hello(func(b []byte) []byte { return b[:12] })},
		{"queue depth 1", goxrcHello(1, 4096)},
		{"queue depth 65535", goxrcHello(0xffff, 4096)},
		{"message size 0", goxrcHello(8, 0)},
		{"message size 2 GiB", goxrcHello(8, 1<<31)},
	} {
		before := cm.GlobalStats().AcceptErrors
		ch, err := rdmacm.NewEventChannel()
		require.NoError(t, err)
		t.Cleanup(func() { ch.Close() }) // closed below; this on a failure
		id, _, err := rawConnect(t, ch, addr, c.pd)
		var re *rdmacm.RejectError
		require.ErrorAs(t, err, &re, "%s: %v", c.name, err)
		require.Eventually(t, func() bool { return cm.GlobalStats().AcceptErrors == before+1 }, 5*time.Second, 10*time.Millisecond, c.name)
		require.NoError(t, id.Close())
		require.NoError(t, ch.Close())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	c, err := l.Accept(ctx)
	require.Nil(t, c)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.NoError(t, l.Close())
	waitObjects(t, base, 10*time.Second)
}

func TestCMNoLeaksAfterManyConnections(t *testing.T) {
	dev, _ := softroce.Device(t)
	base := baseline(t, dev)
	l, addr := cmListen(t, cm.WithQueueDepth(4), cm.WithMessageSize(256))
	// After ctx's cancel (cleanups run last first): the acceptor of a
	// failed dial closes its connection within this test.
	var accepting sync.WaitGroup
	t.Cleanup(accepting.Wait)
	ctx := cmCtx(t, 120*time.Second)
	one := func(i int) error {
		acc := make(chan error, 1)
		accepting.Go(func() {
			c, err := l.Accept(ctx)
			if err == nil {
				buf := make([]byte, 256)
				var n int
				if n, err = c.Recv(ctx, buf); err == nil {
					err = c.Send(ctx, buf[:n])
				}
				if err == nil {
					_, err = c.Recv(ctx, buf)
					if errors.Is(err, io.EOF) {
						err = nil
					}
				}
				err = errors.Join(err, c.Close())
			}
			acc <- err
		})
		c, err := cm.Dial(ctx, addr, cm.WithQueueDepth(4), cm.WithMessageSize(256))
		if err != nil {
			return err
		}
		msg := fmt.Sprintf("conn %d", i)
		buf := make([]byte, 256)
		if err = c.Send(ctx, []byte(msg)); err == nil {
			var n int
			if n, err = c.Recv(ctx, buf); err == nil && string(buf[:n]) != msg {
				err = fmt.Errorf("got %q, want %q", buf[:n], msg)
			}
		}
		return errors.Join(err, c.Close(), <-acc)
	}
	// Each Close waits out the CM's time-wait (about 2 s on rxe), so all
	// but the first three run in parallel, which also overlaps handshakes
	// (until the fifty-second stop ten ran one after the other: 14 s more
	// in each of the guest's two runs, for nothing the three do not show).
	for i := 0; i < 3; i++ {
		require.NoError(t, one(i))
	}
	var wg sync.WaitGroup
	errs := make([]error, 47)
	for i := range errs {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = one(100 + i) }()
	}
	wg.Wait()
	require.NoError(t, errors.Join(errs...))
	require.Equal(t, base.cm.ConnectionsOpen, cm.GlobalStats().ConnectionsOpen)
	require.NoError(t, l.Close())
	waitObjects(t, base, 10*time.Second)
	t.Logf("after 50 connections: %+v", baseline(t, dev))
}

func TestCMRawServerWithRDMAClient(t *testing.T) {
	_, ip := softroce.Device(t)
	bin, err := exec.LookPath("rdma_client")
	if err != nil { // a required package (test/lib.sh): the harness is broken
		t.Fatalf("rdma_client (rdmacm-utils) not installed: %v", err)
	}
	l, addr := cmListen(t, cm.WithRawMessages(), cm.WithMessageSize(64), cm.WithQueueDepth(4))
	port := addr[strings.LastIndexByte(addr, ':')+1:]
	// After ctx's cancel (cleanups run last first): on a failure the
	// server's connection closes within this test.
	var serving sync.WaitGroup
	t.Cleanup(serving.Wait)
	ctx := cmCtx(t, 30*time.Second)
	served := make(chan error, 1)
	serving.Go(func() {
		c, err := l.Accept(ctx)
		if err != nil {
			served <- err
			return
		}
		defer c.Close()
		buf := make([]byte, 64)
		n, err := c.Recv(ctx, buf)
		if err == nil && n != 16 {
			err = fmt.Errorf("rdma_client sent %d bytes, want 16", n)
		}
		if err == nil {
			err = c.Send(ctx, []byte("goxrc raw reply!")) // rdma_client's receive buffer is 16 bytes
		}
		if err == nil {
			// rdma_client disconnects: raw mode has no FIN, so that is ErrPeerGone.
			_, err = c.Recv(ctx, buf)
			if errors.Is(err, cm.ErrPeerGone) || errors.Is(err, io.EOF) {
				err = nil
			} else if err == nil {
				err = errors.New("rdma_client sent a second message")
			}
		}
		served <- err
	})
	out, err := exec.CommandContext(ctx, bin, "-s", ip.String(), "-p", port).CombinedOutput()
	t.Logf("rdma_client: %s", strings.TrimSpace(string(out)))
	require.NoError(t, err, "rdma_client failed")
	require.Contains(t, string(out), "end 0")
	require.NoError(t, <-served)
}

func TestCMRawClientWithRDMAServer(t *testing.T) {
	_, ip := softroce.Device(t)
	bin, err := exec.LookPath("rdma_server")
	if err != nil { // a required package (test/lib.sh): the harness is broken
		t.Fatalf("rdma_server (rdmacm-utils) not installed: %v", err)
	}
	// A port nobody uses: take one from the system, then give it back.
	l, addr := cmListen(t)
	port := addr[strings.LastIndexByte(addr, ':')+1:]
	require.NoError(t, l.Close())
	ctx := cmCtx(t, 30*time.Second)
	srv := exec.CommandContext(ctx, bin, "-s", ip.String(), "-p", port)
	var out strings.Builder
	srv.Stdout, srv.Stderr = &out, &out
	require.NoError(t, srv.Start())
	done, exited := make(chan error, 1), make(chan struct{})
	go func() { done <- srv.Wait(); close(exited) }()
	// On a failure the process and its CM id and QP are gone before the
	// next test (ctx's cancel would kill it only after this test).
	t.Cleanup(func() { srv.Process.Kill(); <-exited })
	var c *cm.Conn
	for c == nil {
		c, err = cm.Dial(ctx, addr, cm.WithRawMessages(), cm.WithMessageSize(64), cm.WithQueueDepth(4))
		var re *rdmacm.RejectError
		if errors.As(err, &re) && ctx.Err() == nil { // not listening yet
			time.Sleep(50 * time.Millisecond)
			continue
		}
		require.NoError(t, err)
	}
	defer c.Close()
	require.NoError(t, c.Send(ctx, []byte("goxrc raw hello!"))) // rdma_server's buffer is 16 bytes
	buf := make([]byte, 64)
	n, err := c.Recv(ctx, buf)
	require.NoError(t, err)
	require.Equal(t, 16, n, "rdma_server answers with its 16-byte buffer")
	// Exactly one reply: then rdma_server disconnects.
	_, err = c.Recv(cmCtx(t, 10*time.Second), buf)
	require.Error(t, err, "a second message from rdma_server")
	require.True(t, errors.Is(err, cm.ErrPeerGone) || errors.Is(err, io.EOF), "after the reply: %v", err)
	select {
	case err := <-done:
		t.Logf("rdma_server: %s", strings.TrimSpace(out.String()))
		require.NoError(t, err)
		require.Contains(t, out.String(), "end 0")
	case <-time.After(20 * time.Second):
		t.Fatal("rdma_server did not exit")
	}
}

func TestCMRecvDeadline(t *testing.T) {
	client, server := cmPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := client.Recv(ctx, make([]byte, 64))
	elapsed := time.Since(start)
	var ne net.Error
	require.ErrorAs(t, err, &ne, "%v", err)
	require.True(t, ne.Timeout(), "%v", err)
	require.Less(t, elapsed, 2*time.Second)
	t.Logf("Recv deadline of 200ms returned after %v: %v", elapsed.Round(time.Millisecond), err)

	// The same through the net.Conn adapter's read deadline.
	nc := server.NetConn()
	require.NoError(t, nc.SetReadDeadline(time.Now().Add(200*time.Millisecond)))
	start = time.Now()
	_, err = nc.Read(make([]byte, 64))
	elapsed = time.Since(start)
	require.ErrorAs(t, err, &ne, "%v", err)
	require.True(t, ne.Timeout(), "%v", err)
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	require.Less(t, elapsed, 2*time.Second)

	// A timeout does not break the connection.
	ctx2 := cmCtx(t, 10*time.Second)
	require.NoError(t, server.Send(ctx2, []byte("late")))
	buf := make([]byte, 64)
	n, err := client.Recv(ctx2, buf)
	require.NoError(t, err)
	require.Equal(t, "late", string(buf[:n]))
}
