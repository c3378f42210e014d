package cm

import (
	"context"
	"io"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/xrc"
	"github.com/goxrc/goxrc/xrc/memfabric"
)

// peerCloseSetup connects a client process to two processes of one server
// node (one TGT, a handle each) and exchanges a message each way on both
// connections. The client then takes nothing off its receive queue, and
// s1 closes, with its endpoint (l1): s1's FIN waits, unread, while a
// message of ours meets its receive queue gone; the TGT lives on, s2's
// process holding it, so our post completes with "remote invalid request".
// It returns c1, whose peer closed, and cli, to resume its receives.
func peerCloseSetup(ctx context.Context, t *testing.T) (c1 *Conn, cli *memfabric.Process) {
	f := newFabric(t)
	sn := f.Node("10.1.0.1")
	cli = f.Node("10.1.0.2").Process()
	sdom, cdom := filepath.Join(t.TempDir(), "s"), filepath.Join(t.TempDir(), "c")
	pair := func(srv *memfabric.Process) (c, s *Conn, l *Listener) {
		l, err := Listen(ctx, "10.1.0.1:0", WithFabric(srv), WithDomainPath(sdom))
		require.NoError(t, err)
		acc := make(chan *Conn, 1)
		go func() { s, _ := l.Accept(ctx); acc <- s }()
		c, err = Dial(ctx, l.Addr().String(), WithFabric(cli), WithDomainPath(cdom))
		require.NoError(t, err)
		s = <-acc
		require.NotNil(t, s)
		return c, s, l
	}
	c1, s1, l1 := pair(sn.Process())
	c2, s2, l2 := pair(sn.Process())
	t.Cleanup(func() { c1.Close(); c2.Close(); s2.Close(); l2.Close() })
	buf := make([]byte, 64)
	for _, p := range [][2]*Conn{{c1, s1}, {c2, s2}, {s1, c1}, {s2, c2}} {
		require.NoError(t, p[0].Send(ctx, []byte("x")))
		_, err := p[1].Recv(ctx, buf)
		require.NoError(t, err)
	}
	require.Equal(t, 1, sn.Stats().TGTs)
	cli.PauseReceives()
	require.NoError(t, s1.Close())
	require.NoError(t, l1.Close())
	require.Equal(t, 1, sn.Stats().TGTs, "s2's process holds the TGT")
	return c1, cli
}

// A message in flight when the peer closed cleanly (its FIN came first)
// failed at the peer's receive queue, and that failure took the FIN's
// place: Send said the peer was gone, not closed (xrc.ErrPeerClosed, which
// the engine's doc promises after the FIN), and the Conn counted a clean
// close in Stats.Errors, which an RC connection does not.
func TestStatsXRCPeerCloseNotAnError(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c1, cli := peerCloseSetup(ctx, t)
	require.NoError(t, c1.Send(ctx, []byte("in flight")))
	cli.ResumeReceives()
	_, err := c1.Recv(ctx, make([]byte, 64))
	require.ErrorIs(t, err, io.EOF)
	// Once the engine is done with the connection (it answered the FIN),
	// nothing more can change what Send says.
	require.Eventually(t, func() bool { return xrcStats().Conns == 2 }, 10*time.Second, time.Millisecond, "c2 and s2 left")
	err = c1.Send(ctx, []byte("after"))
	require.ErrorIs(t, err, ErrPeerGone)
	require.ErrorIs(t, err, xrc.ErrPeerClosed, "the peer closed; its FIN came first")
	require.ErrorIs(t, c1.CloseWrite(), xrc.ErrPeerClosed, "as Send")
	require.Zero(t, c1.Stats().Errors, "a clean close by the peer")
}

// Our Send came before we read the peer's FIN: the engine ends only our
// sending leg and lets the FIN decide, and Recv gives io.EOF, the orderly
// end. But the Send that found the leg ended failed with ErrPeerGone, and
// the Conn counted that in Stats.Errors. Stats now takes the engine's
// verdict (xrc.Conn.Err).
func TestStatsXRCSendRacingPeerCloseNotAnError(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c1, cli := peerCloseSetup(ctx, t)
	// Sends until one fails: each is posted, until the first one's failure
	// at the gone receive queue ends the sending leg.
	var err error
	for err == nil {
		err = c1.Send(ctx, []byte("racing the FIN"))
	}
	require.ErrorIs(t, err, ErrPeerGone)
	cli.ResumeReceives()
	_, err = c1.Recv(ctx, make([]byte, 64))
	require.ErrorIs(t, err, io.EOF, "the peer's orderly end")
	require.Zero(t, c1.Stats().Errors, "a clean close by the peer")
}
