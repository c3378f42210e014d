//go:build linux && cgo

package integration

import (
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/rdmacm"
	"github.com/goxrc/goxrc/verbs"
)

// rdmacmCheckContext checks the verbs context of a bound id.
func rdmacmCheckContext(t *testing.T, id *rdmacm.ID, dev string) {
	t.Helper()
	c := id.VerbsContext()
	if c == nil {
		t.Errorf("Context() of an id bound to %s is nil", dev)
		return
	}
	if c.Name() != dev {
		t.Errorf("Context().Name() = %q, want %q", c.Name(), dev)
	}
	if err := c.Close(); err != nil {
		t.Errorf("closing the wrapper: %v", err)
	}
}

// twoWrappers wraps the device context of an id listening on port twice
// (each ID.VerbsContext call wraps it anew).
func twoWrappers(t *testing.T, port uint16) (*verbs.Context, *verbs.Context) {
	_, ip := rdmacmEnv(t)
	l := rdmacmListen(t, rdmacmChannel(t), rdmacm.PortSpaceTCP, verbs.QPTypeRC, netip.AddrPortFrom(ip, port))
	wa, wb := l.VerbsContext(), l.VerbsContext()
	require.NotNil(t, wa)
	require.NotNil(t, wb)
	require.NotSame(t, wa, wb, "two wrappers of one C context")
	cleanupClose(t, wa)
	cleanupClose(t, wb)
	return wa, wb
}

// TestVerbsSharedChannelAcrossWrappers: librdmacm's device context can be
// wrapped more than once (each ID.VerbsContext call wraps it anew). A CQ made
// through one wrapper on a shared channel made through another must still
// have its events delivered by that channel: the wrappers share one
// registry of CQs. Before they did, the channel's reader found no such CQ
// and dropped its events, and GetEvents waited for ever.
func TestVerbsSharedChannelAcrossWrappers(t *testing.T) {
	wa, wb := twoWrappers(t, 20112)

	ch, err := wa.NewSharedCompChannel()
	require.NoError(t, err)
	cleanupClose(t, ch)
	pd, err := wb.AllocPD()
	require.NoError(t, err)
	cleanupClose(t, pd)
	cqB, err := wb.CreateCQ(16, ch, 0) // the other wrapper's channel
	require.NoError(t, err)
	cleanupClose(t, cqB)
	cqA, err := wa.CreateCQ(16, ch, 0)
	require.NoError(t, err)
	cleanupClose(t, cqA)
	mr, err := pd.RegMR(4096, verbs.AccessLocalWrite)
	require.NoError(t, err)
	cleanupClose(t, mr)
	snd, rcv := smallRCQP(t, pd, cqA), smallRCQP(t, pd, cqB)
	connectRC(t, wb, snd, rcv)

	sendSeeingEvents(t, ch, cqA, cqB, snd, rcv, mr)
}

// TestVerbsAsyncEventsAcrossWrappers: a device context has one async
// descriptor however many wrappers it has. Every wrapper that asked for its
// async events gets each event; before, each wrapper started a reader of
// its own and an event went to whichever read first. Closing one wrapper
// ends its channel only.
func TestVerbsAsyncEventsAcrossWrappers(t *testing.T) {
	wa, wb := twoWrappers(t, 20113)
	ea, eb := wa.AsyncEvents(), wb.AsyncEvents()
	require.NotNil(t, ea, "%v", wa.AsyncErr())
	require.NotNil(t, eb, "%v", wb.AsyncErr())

	pd, err := wa.AllocPD()
	require.NoError(t, err)
	cleanupClose(t, pd)
	srq, err := pd.CreateSRQ(verbs.SRQInit{MaxWR: 16, MaxSGE: 1})
	require.NoError(t, err)
	cleanupClose(t, srq)
	p := newRCPair(t, wa, srq, pd)
	recvs := make([]verbs.RecvWR, 4)
	for i := range recvs {
		recvs[i] = verbs.RecvWR{ID: uint64(i), SGL: []verbs.SGE{p.peerMR.SGE(i*256, 256)}}
	}
	require.NoError(t, srq.PostRecv(recvs))
	require.NoError(t, srq.Arm(2))
	for i := range 3 {
		require.NoError(t, p.a.PostSend([]verbs.SendWR{{ID: uint64(10 + i), Opcode: verbs.WRSend,
			Flags: verbs.SendSignaled, Inline: []byte("limit")}}))
	}
	p.collect(t, 6)
	for name, events := range map[string]<-chan verbs.AsyncEvent{"first wrapper": ea, "second wrapper": eb} {
		select {
		case ev, ok := <-events:
			require.True(t, ok, "%s: channel closed: %v", name, wa.AsyncErr())
			require.Equal(t, verbs.EventSRQLimitReached, ev.Type, name)
			require.Same(t, srq, ev.SRQ, name)
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: no SRQ limit event", name)
		}
	}

	require.NoError(t, wb.Close())
	requireEventsEnd(t, eb)
	select {
	case ev, ok := <-ea:
		t.Fatalf("the open wrapper's channel gave %v (open %v) when the other closed", ev, ok)
	case <-time.After(100 * time.Millisecond):
	}
	require.NoError(t, wa.AsyncErr())
}
