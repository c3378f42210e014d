//go:build linux && cgo

package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/cm"
	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/internal/kernel/kcm"
	"github.com/goxrc/goxrc/test/softroce"
)

// pairPort is where guest A serves TestTwoNodes' connections, pairCMPort
// its bare CM exchanges (XRC-typed and SIDR listeners on one port).
const (
	pairPort   = 7500
	pairCMPort = 7501
	pairBPort  = 7502 // B's listener, which A dials
	// B's listener without a keepalive: its connection notices the
	// vanished node when it sends.
	pairBPlainPort = 7503
)

// TestTwoNodes runs across two guests, two kernels on one virtual wire
// (test/vm/rxe-pair.sh; test/run-tests.sh runs it so): GOXRC_PAIR_ROLE=a in
// guest A serves, =b in guest B checks. Between two kernels nothing is
// looped back inside one rxe, each side has its own RDMA CM, and node A can
// vanish: the host kills A's emulator outright, so nothing (no DREQ, no
// flushed QP) tells B, as when a machine loses power. B checks that its
// calls, on connections it dialed and one it accepted from A, then fail on
// their own (keepalive, transport retries) with
// ErrPeerGone, that a dial to the dead node ends at its deadline, and that
// nothing of B's is leaked. Before that, B checks the kernel CM rules the
// XRC engine stands on (../shared/design/facts.md, docs/xrc-protocol.md)
// between two kernels, where on one node both ends share one CA GUID: see
// pairCheckCM.
func TestTwoNodes(t *testing.T) {
	role, sync := os.Getenv("GOXRC_PAIR_ROLE"), os.Getenv("RXE_PAIR_SYNC")
	if role == "" || sync == "" {
		t.Skip("needs two soft-RoCE guests on one wire: runs through test/vm/rxe-pair.sh (test/run-tests.sh does)")
	}
	dev, ip := softroce.Device(t)
	peer, ok := softroce.PeerIP()
	require.True(t, ok, "RXE_PEER_IP unset")
	switch role {
	case "a":
		pairServe(t, ip, sync)
	case "b":
		pairCheck(t, dev, ip, peer, sync)
	default:
		t.Fatalf("GOXRC_PAIR_ROLE=%q: want a or b", role)
	}
}

// pairServe echoes every message of every connection until B is done (or
// the host kills this node, which is how B's checks end).
func pairServe(t *testing.T, ip netip.Addr, sync string) {
	ctx := cmCtx(t, 4*time.Minute)
	// A is killed before its test ends, so a failure of its own (an Errorf,
	// one in a goroutine) would print no result: B reads it from this
	// marker before it has A killed.
	go func() {
		for ctx.Err() == nil && !t.Failed() {
			time.Sleep(20 * time.Millisecond)
		}
		if t.Failed() {
			os.WriteFile(filepath.Join(sync, "a-failed"), nil, 0o644)
		}
	}()
	l, err := cm.Listen(ctx, netip.AddrPortFrom(ip, pairPort).String(), cm.WithMessageSize(4096), cm.WithQueueDepth(8))
	require.NoError(t, err)
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept(ctx)
			if err != nil {
				return
			}
			t.Logf("accepted %v", c.RemoteAddr())
			go func() {
				defer c.Close()
				buf := make([]byte, 4096)
				for {
					n, err := c.Recv(ctx, buf)
					if err == nil {
						err = c.Send(ctx, buf[:n])
					}
					if err != nil {
						t.Logf("%v: %v", c.RemoteAddr(), err)
						return
					}
				}
			}()
		}
	}()
	cmSrv, err := kcm.New(ip)
	require.NoError(t, err)
	defer cmSrv.Close()
	go pairServeCM(t, ctx, cmSrv, netip.AddrPortFrom(ip, pairCMPort))
	mark(t, sync, "a-ready")

	// A connection the other way, for B's accepting side to lose.
	peer, _ := softroce.PeerIP()
	waitMark(t, ctx, sync, "b-listening")
	for _, port := range []uint16{pairBPort, pairBPlainPort} {
		c, err := cm.Dial(ctx, netip.AddrPortFrom(peer, port).String(), cm.WithMessageSize(4096), cm.WithQueueDepth(8))
		require.NoError(t, err)
		defer c.Close()
		require.NoError(t, c.Send(ctx, []byte("from A")))
	}
	waitMark(t, ctx, sync, "b-done")
}

// pairServeCM answers bare CM exchanges on one port, as an XRC endpoint's
// listeners do but without QPs: an XRC-typed request with the requester's
// own INI number as the TGT number (legal between two nodes), a SIDR
// request with sidrQPN.
func pairServeCM(t *testing.T, ctx context.Context, c *kcm.CM, addr netip.AddrPort) {
	for _, ex := range []kernel.Exchange{kernel.ExchangeXRC, kernel.ExchangeSIDR} {
		l, err := c.Listen(addr, ex)
		if err != nil {
			t.Errorf("listen %v: %v", ex, err)
			return
		}
		go func() {
			for {
				ev, err := c.Event(ctx, l)
				if err != nil {
					return
				}
				if ev.Type != kernel.EventConnectRequest {
					continue
				}
				qpn := ev.QPNum
				if ex == kernel.ExchangeSIDR {
					qpn = sidrQPN
				}
				if err := c.Accept(ev.ID, qpn, []byte("accepted")); err != nil {
					t.Logf("%v accept: %v", ex, err)
				}
				if ex == kernel.ExchangeSIDR {
					c.DestroyID(ev.ID)
					continue
				}
				go func() { // the connection's events, until it goes
					for {
						if _, err := c.Event(ctx, ev.ID); err != nil {
							return
						}
					}
				}()
			}
		}()
	}
}

const sidrQPN = 0x345678

// pairCheckCM makes bare CM exchanges with node A through kcm, the XRC
// engine's kernel CM layer:
//   - an XRC-typed exchange whose INI and TGT numbers are equal, which one
//     node could not carry (its CM would see a live connection to itself
//     reuse the number);
//   - many SIDR exchanges to the same port while that connection lives:
//     none meets the stale-connection rule (SIDR stays out of its table),
//     which is what lets an uplink carry any number of logical connections;
//   - a second XRC-typed request naming the live INI number again: rejected
//     as stale (reason 10), and the first connection gets a DREQ.
func pairCheckCM(t *testing.T, ctx context.Context, ip, peer netip.Addr) {
	c, err := kcm.New(ip)
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Close()) }()
	dst := netip.AddrPortFrom(peer, pairCMPort)
	const ini = 0x123456

	first, err := c.Connect(ctx, dst, kernel.ExchangeXRC, ini, []byte("physical"))
	require.NoError(t, err)
	ev, err := c.Event(ctx, first)
	require.NoError(t, err)
	require.Equal(t, kernel.EventConnectResponse, ev.Type, "%+v", ev)
	require.Equal(t, uint32(ini), ev.QPNum, "node A answered with our own number as its TGT")
	require.Equal(t, "accepted", string(bytes.TrimRight(ev.PrivateData, "\x00")))
	require.NoError(t, c.Establish(first))

	for i := range 30 {
		v, err := c.Connect(ctx, dst, kernel.ExchangeSIDR, 0, []byte(fmt.Sprintf("virtual %d", i)))
		require.NoError(t, err)
		ev, err := c.Event(ctx, v)
		require.NoError(t, err)
		require.Equal(t, kernel.EventEstablished, ev.Type, "SIDR exchange %d: %+v", i, ev)
		require.Equal(t, uint32(sidrQPN), ev.QPNum)
		require.NoError(t, c.DestroyID(v))
	}

	again, err := c.Connect(ctx, dst, kernel.ExchangeXRC, ini, []byte("physical again"))
	require.NoError(t, err)
	ev, err = c.Event(ctx, again)
	require.NoError(t, err)
	require.Equal(t, kernel.EventRejected, ev.Type, "%+v", ev)
	require.Equal(t, kernel.RejStaleConn, ev.Status, "rejected as a stale connection")
	ev, err = c.Event(ctx, first)
	require.NoError(t, err)
	require.Equal(t, kernel.EventDisconnected, ev.Type, "the first connection gets a DREQ: %+v", ev)
	require.NoError(t, c.DestroyID(again))
	require.NoError(t, c.DestroyID(first))
}

func pairCheck(t *testing.T, dev string, ip, peer netip.Addr, sync string) {
	ctx := cmCtx(t, 4*time.Minute)
	waitMark(t, ctx, sync, "a-ready")
	pairCheckCM(t, ctx, ip, peer)
	base := baseline(t, dev)
	addr := netip.AddrPortFrom(peer, pairPort).String()
	opts := []cm.Option{cm.WithMessageSize(4096), cm.WithQueueDepth(8), cm.WithHandshakeTimeout(5 * time.Second)}

	// One connection with a keepalive, one without: the first notices the
	// dead node while idle, the second when it sends.
	watched, err := cm.Dial(ctx, addr, append(opts, cm.WithKeepalive(200*time.Millisecond))...)
	require.NoError(t, err)
	plain, err := cm.Dial(ctx, addr, opts...)
	require.NoError(t, err)
	require.Equal(t, addr, watched.RemoteAddr().String())
	require.Equal(t, ip, netip.MustParseAddrPort(watched.LocalAddr().String()).Addr())

	// Across the wire, byte for byte, every size up to the maximum.
	buf := make([]byte, 4096)
	for i, c := range []*cm.Conn{watched, plain} {
		for k := range 60 {
			n := 1 + (k*397)%4096
			if k == 59 {
				n = 4096
			}
			msg := bytes.Repeat([]byte{byte(i*60 + k)}, n)
			require.NoError(t, c.Send(ctx, msg))
			got, err := c.Recv(ctx, buf)
			require.NoError(t, err)
			require.Equal(t, msg, buf[:got], "connection %d, message %d", i, k)
		}
	}

	// A's connection to B's listener, whose connections have a keepalive:
	// the accepting side must notice the dialing node vanish too.
	l, err := cm.Listen(ctx, netip.AddrPortFrom(ip, pairBPort).String(), append(opts, cm.WithKeepalive(200*time.Millisecond))...)
	require.NoError(t, err)
	lp, err := cm.Listen(ctx, netip.AddrPortFrom(ip, pairBPlainPort).String(), opts...)
	require.NoError(t, err)
	mark(t, sync, "b-listening")
	var accepted, acceptedPlain *cm.Conn
	for _, a := range []struct {
		l *cm.Listener
		c **cm.Conn
	}{{l, &accepted}, {lp, &acceptedPlain}} {
		c, err := a.l.Accept(ctx)
		require.NoError(t, err)
		got, err := c.Recv(ctx, buf)
		require.NoError(t, err)
		require.Equal(t, "from A", string(buf[:got]))
		require.Equal(t, peer, netip.MustParseAddrPort(c.RemoteAddr().String()).Addr())
		*a.c = c
	}

	// A blocked Recv on each, then node A vanishes.
	recvErr := map[*cm.Conn]chan error{watched: make(chan error, 1), plain: make(chan error, 1), accepted: make(chan error, 1), acceptedPlain: make(chan error, 1)}
	for c, ch := range recvErr {
		go func() {
			_, err := c.Recv(ctx, make([]byte, 4096))
			ch <- err
		}()
	}
	// A's application makes no call on the connection B accepted: B's
	// probes go on all the same (as credit frames they stopped within the
	// queue depth: A returns credits only while its application calls).
	if !assert.Eventually(t, func() bool { return accepted.Stats().Keepalives >= 12 }, 30*time.Second, 50*time.Millisecond) {
		t.Fatalf("probes to a peer whose application is idle stopped: %+v", accepted.Stats())
	}
	require.NoFileExists(t, filepath.Join(sync, "a-failed"), "node A failed a check of its own (its log says which)")
	mark(t, sync, "kill-a")
	waitMark(t, ctx, sync, "a-killed")
	killed := time.Now()

	// A blocked call must fail on its own within a minute, with
	// ErrPeerGone.
	requireLost := func(what string, c *cm.Conn) {
		t.Helper()
		select {
		case err := <-recvErr[c]:
			t.Logf("%s failed %v after the kill: %v", what, time.Since(killed).Round(time.Millisecond), err)
			requirePeerGone(t, what, err)
		case <-time.After(60 * time.Second):
			out, _ := exec.Command("rdma", "res", "show", "qp", "-dd").CombinedOutput()
			stat, _ := exec.Command("rdma", "statistic", "show").CombinedOutput()
			t.Fatalf("%s still blocked 60 s after node A vanished; stats %+v\n%s\n%s", what, c.Stats(), out, stat)
		}
	}
	// The keepalive's probes find no one: their retries run out.
	requireLost("Recv with keepalive", watched)
	requireLost("Recv on the accepting side (keepalive)", accepted)
	// Without one, a Send does the same, on either side (the accepting
	// side's QP took its retry count and timeout from A's request).
	require.NoError(t, plain.Send(ctx, []byte("anyone there?")), "the send is posted; its failure comes later")
	require.NoError(t, acceptedPlain.Send(ctx, []byte("anyone there?")), "the send is posted; its failure comes later")
	requireLost("Recv after a Send", plain)
	requireLost("Recv after a Send on the accepting side", acceptedPlain)

	// A dial to the dead node ends at its deadline, leaving nothing.
	dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	start := time.Now()
	c, err := cm.Dial(dctx, addr, opts...)
	cancel()
	if c != nil {
		c.Close()
	}
	t.Logf("Dial to the vanished node: %v after %v", err, time.Since(start).Round(time.Millisecond))
	require.Error(t, err)
	require.Less(t, time.Since(start), 10*time.Second, "the dial outlived its deadline")

	// Nobody is left to say goodbye to: Close releases at once, rather
	// than wait for the CM to give up on its disconnect request.
	for _, c := range []*cm.Conn{watched, plain, accepted, acceptedPlain} {
		start := time.Now()
		require.NoError(t, c.Close())
		t.Logf("Close took %v", time.Since(start).Round(time.Millisecond))
		require.Less(t, time.Since(start), 4*time.Second, "Close waited for the vanished peer (handshake timeout 5 s)")
	}
	require.NoError(t, l.Close())
	require.NoError(t, lp.Close())
	waitObjects(t, base, 15*time.Second)
	mark(t, sync, "b-done")
}

// mark creates the marker file name in the pair's shared directory.
func mark(t *testing.T, dir, name string) {
	t.Helper()
	require.NoError(t, os.WriteFile(filepath.Join(dir, name), nil, 0o644))
}

// waitMark waits until the marker name exists.
func waitMark(t *testing.T, ctx context.Context, dir, name string) {
	t.Helper()
	for {
		if _, err := os.Stat(filepath.Join(dir, name)); err == nil {
			return
		} else if !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		select {
		case <-ctx.Done():
			t.Fatal(fmt.Errorf("waiting for %s: %w", name, ctx.Err()))
		case <-time.After(50 * time.Millisecond):
		}
	}
}
