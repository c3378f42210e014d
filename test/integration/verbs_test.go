//go:build linux && cgo

package integration

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/cm"
	"github.com/goxrc/goxrc/internal/faults"
	"github.com/goxrc/goxrc/internal/objtrace"
	"github.com/goxrc/goxrc/rdmacm"
	"github.com/goxrc/goxrc/verbs"
)

// The verbs tests run against the real rxe device of the VM: one process,
// two RC QPs connected to each other by hand through the port's RoCEv2 GID.

const verbsPort = 1

// openRXE opens $RXE_DEV; it skips without one and fails if it cannot open.
func openRXE(t testing.TB) *verbs.Context {
	t.Helper()
	dev := os.Getenv("RXE_DEV")
	if dev == "" {
		t.Skip("no soft-RoCE device (RXE_DEV unset): run through the VM harness")
	}
	requireNoVerbsLeaks(t)
	ctx, err := verbs.OpenDevice(dev)
	require.NoError(t, err, "RXE_DEV=%s is set but the device does not open", dev)
	t.Cleanup(func() { require.NoError(t, ctx.Close()) })
	return ctx
}

// requireNoVerbsLeaks checks, after every other cleanup of the test, that
// every verbs object the test made was released: the counts are back to
// those at its start. Objects an earlier test left are logged, not blamed on
// this one (each later test failed for one leak; TestZZNothingLeaked reports
// it). Register it before creating anything.
func requireNoVerbsLeaks(t testing.TB) {
	t.Helper()
	cm.CloseIdleDevices() // an earlier test's, kept open while idle
	start := verbs.Counts()
	if !start.IsZero() {
		t.Logf("objects left over from an earlier test: %+v", start)
	}
	t.Cleanup(func() {
		require.Equal(t, start, verbs.Counts(), "leaked verbs objects (the counts at the start first)\n%s", objtrace.Report())
	})
}

func rxeIP(t testing.TB) net.IP {
	s := os.Getenv("RXE_IP")
	if s == "" {
		t.Skip("RXE_IP unset: run through the VM harness")
	}
	ip := net.ParseIP(s)
	require.NotNil(t, ip, "RXE_IP=%q", s)
	return ip
}

// roceGID finds the RoCEv2 GID of the port for ip.
func roceGID(t testing.TB, ctx *verbs.Context, ip net.IP) verbs.GIDEntry {
	t.Helper()
	gids, err := ctx.GIDs(verbsPort)
	require.NoError(t, err)
	for _, g := range gids {
		if g.Type == verbs.GIDTypeRoCEv2 && g.GID.IP().Equal(ip) {
			return g
		}
	}
	t.Fatalf("no RoCEv2 GID for %v in %+v", ip, gids)
	return verbs.GIDEntry{}
}

func cleanupClose(t testing.TB, c interface{ Close() error }) {
	t.Cleanup(func() { require.NoError(t, c.Close()) })
}

func TestVerbsDeviceAndPort(t *testing.T) {
	ctx := openRXE(t)
	ip := rxeIP(t)

	devs, err := verbs.Devices()
	require.NoError(t, err)
	var found bool
	for _, d := range devs {
		if d.Name == ctx.Name() {
			found = true
			require.Equal(t, verbs.TransportIB, d.Transport)
			require.NotZero(t, d.NodeGUID)
		}
	}
	require.True(t, found, "%s not in %+v", ctx.Name(), devs)

	attr, err := ctx.QueryDevice()
	require.NoError(t, err)
	t.Logf("%s: max_qp %d max_qp_wr %d max_sge %d max_srq %d max_srq_wr %d atomic %d caps %#x",
		ctx.Name(), attr.MaxQP, attr.MaxQPWR, attr.MaxSGE, attr.MaxSRQ, attr.MaxSRQWR, attr.AtomicCap, uint64(attr.CapFlags))
	require.Positive(t, attr.MaxQP)
	require.Positive(t, attr.MaxQPWR)
	require.Positive(t, attr.MaxSGE)
	require.Positive(t, attr.MaxSRQ)
	require.Positive(t, attr.MaxSRQWR)
	require.Positive(t, attr.MaxCQE)
	require.NotEqual(t, verbs.AtomicNone, attr.AtomicCap, "rxe does atomics")
	require.False(t, attr.XRC(), "rxe has no XRC")
	require.Equal(t, 1, attr.PhysPortCnt)

	pa, err := ctx.QueryPort(verbsPort)
	require.NoError(t, err)
	t.Logf("port 1: %v active MTU %v max MTU %v gid table %d link %d", pa.State, pa.ActiveMTU, pa.MaxMTU, pa.GIDTableLen, pa.LinkLayer)
	require.Equal(t, verbs.PortActive, pa.State)
	require.Equal(t, verbs.LinkLayerEthernet, pa.LinkLayer)
	require.NotZero(t, pa.ActiveMTU.Bytes())

	g := roceGID(t, ctx, ip)
	t.Logf("GID %d %v type %d netdev %q", g.Index, g.GID, g.Type, g.Netdev)
	if nd := os.Getenv("RXE_NETDEV"); nd != "" {
		require.Equal(t, nd, g.Netdev)
	}

	_, err = ctx.QueryPort(9)
	require.Error(t, err, "port 9 does not exist")
}

func TestVerbsOpenUnknownDevice(t *testing.T) {
	openRXE(t) // only to skip outside the VM
	_, err := verbs.OpenDevice("nope0")
	require.ErrorIs(t, err, syscall.ENODEV)
	require.Contains(t, err.Error(), "nope0")
}

func TestVerbsObjectsLifecycle(t *testing.T) {
	ctx := openRXE(t)
	// Each is closed below, the cleanups on a failure before.
	pd, err := ctx.AllocPD()
	require.NoError(t, err)
	cleanupClose(t, pd)

	mr, err := pd.RegMR(10000, verbs.AccessLocalWrite|verbs.AccessRemoteRead)
	require.NoError(t, err)
	cleanupClose(t, mr)
	require.Len(t, mr.Bytes(), 10000)
	require.Zero(t, mr.Addr()%uint64(os.Getpagesize()), "page aligned")
	require.NotZero(t, mr.LKey())
	copy(mr.Bytes(), "touch")

	// A parent with live children refuses to close, and stays usable.
	err = pd.Close()
	require.ErrorIs(t, err, syscall.EBUSY)
	err = ctx.Close()
	require.ErrorIs(t, err, syscall.EBUSY)

	ch, err := ctx.NewCompChannel()
	require.NoError(t, err)
	cleanupClose(t, ch)
	cq, err := ctx.CreateCQ(16, ch, 0)
	require.NoError(t, err)
	cleanupClose(t, cq)
	require.GreaterOrEqual(t, cq.CQE(), 16)
	_, err = ctx.CreateCQ(16, ch, 0)
	require.ErrorIs(t, err, syscall.EBUSY, "one CQ per channel")
	require.ErrorIs(t, ch.Close(), syscall.EBUSY)

	srq, err := pd.CreateSRQ(verbs.SRQInit{MaxWR: 32, MaxSGE: 1})
	require.NoError(t, err)
	cleanupClose(t, srq)
	num, err := srq.Num()
	t.Logf("basic SRQ number on rxe: %d, %v", num, err)
	if err != nil {
		require.ErrorIs(t, err, verbs.ErrNotSupported, "a basic SRQ's number: a number or not supported")
	} else {
		require.NotZero(t, num)
	}

	require.NoError(t, srq.Close())
	require.NoError(t, srq.Close(), "idempotent")
	require.ErrorIs(t, srq.PostRecv([]verbs.RecvWR{{ID: 1}}), verbs.ErrClosed)
	require.NoError(t, cq.Close())
	_, err = cq.Poll(make([]verbs.WorkCompletion, 1))
	require.ErrorIs(t, err, verbs.ErrClosed)
	require.NoError(t, ch.Close())
	require.NoError(t, mr.Close())
	require.NoError(t, mr.Close())
	require.Nil(t, mr.Bytes())
	require.NoError(t, pd.Close())
	_, err = pd.RegMR(4096, verbs.AccessLocalWrite)
	require.ErrorIs(t, err, verbs.ErrClosed)
}

// TestVerbsCQArgumentsAndClosed: a completion vector past C's int is
// refused (it wrapped to another vector), and waiting on a closed CQ or
// channel says closed (it said EINVAL, for the CQ's missing channel or the
// channel's kind).
func TestVerbsCQArgumentsAndClosed(t *testing.T) {
	vctx := openRXE(t)
	_, err := vctx.CreateCQ(4, nil, 1<<32)
	require.ErrorIs(t, err, syscall.EINVAL)
	_, err = vctx.CreateCQ(4, nil, -1)
	require.ErrorIs(t, err, syscall.EINVAL)
	ctx := context.Background()
	wcs := make([]verbs.WorkCompletion, 4)
	cq, err := vctx.CreateCQ(4, nil, 0)
	require.NoError(t, err)
	require.NoError(t, cq.Close())
	_, err = cq.Wait(ctx, wcs)
	require.ErrorIs(t, err, verbs.ErrClosed)
	ch, err := vctx.NewCompChannel()
	require.NoError(t, err)
	require.NoError(t, ch.Close())
	_, err = ch.GetEvents(ctx, []*verbs.CQ{cq})
	require.ErrorIs(t, err, verbs.ErrClosed)
}

func TestVerbsXRCNotSupportedOnRXE(t *testing.T) {
	ctx := openRXE(t)
	_, err := ctx.OpenXRCD("", 0)
	require.ErrorIs(t, err, verbs.ErrNotSupported, "private XRCD on rxe")
	t.Logf("private XRCD: %v", err)

	path := filepath.Join(t.TempDir(), "domain")
	_, err = ctx.OpenXRCD(path, verbs.XRCDCreate)
	require.ErrorIs(t, err, verbs.ErrNotSupported, "file XRCD on rxe")
	var oe *verbs.OpError
	require.ErrorAs(t, err, &oe)
	require.Equal(t, "ibv_open_xrcd", oe.Op)
	_, statErr := os.Stat(path)
	require.NoError(t, statErr, "the domain file is created with XRCDCreate")

	// Combinations are checked before any C call.
	pd, err := ctx.AllocPD()
	require.NoError(t, err)
	cleanupClose(t, pd)
	_, err = pd.CreateQP(verbs.QPInit{Type: verbs.QPTypeXRCSend})
	require.ErrorIs(t, err, syscall.EINVAL)
	require.Contains(t, err.Error(), "send CQ")
	_, err = pd.CreateQP(verbs.QPInit{Type: verbs.QPTypeXRCRecv})
	require.ErrorIs(t, err, syscall.EINVAL)
	require.Contains(t, err.Error(), "XRC domain")
}

// rcPair is two RC QPs of one device connected to each other.
type rcPair struct {
	ctx    *verbs.Context
	pd     *verbs.PD
	cq     *verbs.CQ
	a, b   *verbs.QP
	mr     *verbs.MR // a's memory
	peerMR *verbs.MR // b's memory
	wcs    []verbs.WorkCompletion
}

const pairAccess = verbs.AccessLocalWrite | verbs.AccessRemoteWrite | verbs.AccessRemoteRead | verbs.AccessRemoteAtomic

func newRCPair(t testing.TB, ctx *verbs.Context, srq *verbs.SRQ, pd *verbs.PD) *rcPair {
	t.Helper()
	p := &rcPair{ctx: ctx, pd: pd, wcs: make([]verbs.WorkCompletion, 64)}
	ch, err := ctx.NewCompChannel()
	require.NoError(t, err)
	cleanupClose(t, ch)
	p.cq, err = ctx.CreateCQ(256, ch, 0)
	require.NoError(t, err)
	cleanupClose(t, p.cq)
	p.mr, err = pd.RegMR(1<<16, pairAccess)
	require.NoError(t, err)
	cleanupClose(t, p.mr)
	p.peerMR, err = pd.RegMR(1<<16, pairAccess)
	require.NoError(t, err)
	cleanupClose(t, p.peerMR)

	mk := func() *verbs.QP {
		init := verbs.QPInit{Type: verbs.QPTypeRC, SendCQ: p.cq, RecvCQ: p.cq, SRQ: srq,
			Cap: verbs.QPCap{MaxSendWR: 64, MaxSendSGE: 2, MaxInlineData: 64}}
		if srq == nil {
			init.Cap.MaxRecvWR, init.Cap.MaxRecvSGE = 64, 2
		}
		qp, err := pd.CreateQP(init)
		require.NoError(t, err)
		cleanupClose(t, qp)
		require.Equal(t, verbs.QPTypeRC, qp.Type())
		require.NotZero(t, qp.Num())
		return qp
	}
	p.a, p.b = mk(), mk()
	connectRC(t, ctx, p.a, p.b)
	_, caps, err := p.a.Query(verbs.QPAttrState)
	require.NoError(t, err)
	require.GreaterOrEqual(t, caps.MaxSendWR, uint32(64))
	return p
}

// connectRC moves two RC QPs of ctx's device through RTR to RTS, each
// connected to the other.
func connectRC(t testing.TB, ctx *verbs.Context, a, b *verbs.QP) {
	t.Helper()
	gid := roceGID(t, ctx, rxeIP(t))
	pa, err := ctx.QueryPort(verbsPort)
	require.NoError(t, err)
	da, err := ctx.QueryDevice()
	require.NoError(t, err)
	rd := uint8(min(da.MaxQPRdAtom, da.MaxQPInitRdAtom, 8))
	connect := func(q *verbs.QP, dest uint32) {
		attr := verbs.QPAttr{State: verbs.QPStateInit, PortNum: verbsPort, AccessFlags: pairAccess}
		require.NoError(t, q.Modify(&attr, verbs.RequiredMask(verbs.QPTypeRC, verbs.QPStateReset, verbs.QPStateInit)))
		attr = verbs.QPAttr{
			State: verbs.QPStateRTR, PathMTU: pa.ActiveMTU, DestQPNum: dest, RQPSN: 100,
			MaxDestRdAtomic: rd, MinRNRTimer: 12,
			AH: verbs.AHAttr{IsGlobal: true, PortNum: verbsPort,
				GRH: verbs.GlobalRoute{DGID: gid.GID, SGIDIndex: uint8(gid.Index), HopLimit: 64}},
		}
		require.NoError(t, q.Modify(&attr, verbs.RequiredMask(verbs.QPTypeRC, verbs.QPStateInit, verbs.QPStateRTR)))
		attr = verbs.QPAttr{State: verbs.QPStateRTS, SQPSN: 100, Timeout: 14, RetryCnt: 7, RNRRetry: 7, MaxQPRdAtomic: rd}
		require.NoError(t, q.Modify(&attr, verbs.RequiredMask(verbs.QPTypeRC, verbs.QPStateRTR, verbs.QPStateRTS)))
	}
	connect(a, b.Num())
	connect(b, a.Num())
	got, _, err := a.Query(verbs.QPAttrState | verbs.QPAttrDestQPN | verbs.QPAttrPathMTU)
	require.NoError(t, err)
	require.Equal(t, verbs.QPStateRTS, got.State)
	require.Equal(t, b.Num(), got.DestQPNum)
	require.Equal(t, pa.ActiveMTU, got.PathMTU)
}

// cqSetup opens the device and makes a PD, a completion channel (shared,
// or for one CQ), a CQ of cqe entries on it and a local-write MR of size
// bytes, all closed at the test's end.
func cqSetup(t *testing.T, shared bool, cqe, size int) (*verbs.Context, *verbs.PD, *verbs.CompChannel, *verbs.CQ, *verbs.MR) {
	t.Helper()
	ctx := openRXE(t)
	pd, err := ctx.AllocPD()
	require.NoError(t, err)
	cleanupClose(t, pd)
	newCh := ctx.NewCompChannel
	if shared {
		newCh = ctx.NewSharedCompChannel
	}
	ch, err := newCh()
	require.NoError(t, err)
	cleanupClose(t, ch)
	cq, err := ctx.CreateCQ(cqe, ch, 0)
	require.NoError(t, err)
	cleanupClose(t, cq)
	mr, err := pd.RegMR(size, verbs.AccessLocalWrite)
	require.NoError(t, err)
	cleanupClose(t, mr)
	return ctx, pd, ch, cq, mr
}

// smallRCQP makes an RC QP of four sends and four receives on cq, closed
// at the test's end.
func smallRCQP(t *testing.T, pd *verbs.PD, cq *verbs.CQ) *verbs.QP {
	t.Helper()
	qp, err := pd.CreateQP(verbs.QPInit{Type: verbs.QPTypeRC, SendCQ: cq, RecvCQ: cq,
		Cap: verbs.QPCap{MaxSendWR: 4, MaxRecvWR: 4, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	cleanupClose(t, qp)
	return qp
}

// sendSeeingEvents arms the send CQ cqA and the receive CQ cqB of a shared
// channel, sends one message from a to b, and waits until the channel has
// reported an event for each CQ.
func sendSeeingEvents(t *testing.T, ch *verbs.CompChannel, cqA, cqB *verbs.CQ, a, b *verbs.QP, mr *verbs.MR) {
	t.Helper()
	require.NoError(t, cqA.ReqNotify(false))
	require.NoError(t, cqB.ReqNotify(false))
	require.NoError(t, b.PostRecv([]verbs.RecvWR{{ID: 1, SGL: []verbs.SGE{mr.SGE(0, 64)}}}))
	require.NoError(t, a.PostSend([]verbs.SendWR{{ID: 2, Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{mr.SGE(64, 16)}}}))
	seen := map[*verbs.CQ]bool{}
	cqs := make([]*verbs.CQ, 4)
	wait, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for len(seen) < 2 {
		n, err := ch.GetEvents(wait, cqs)
		require.NoError(t, err, "events seen: %v (send CQ %p, receive CQ %p)", seen, cqA, cqB)
		for _, q := range cqs[:n] {
			require.True(t, q == cqA || q == cqB, "an event names one of the channel's CQs")
			seen[q] = true
		}
	}
}

// TestVerbsSharedCompChannel: many CQs on one channel, whose events one
// reader takes with GetEvents.
func TestVerbsSharedCompChannel(t *testing.T) {
	ctx := openRXE(t)
	pd, err := ctx.AllocPD()
	require.NoError(t, err)
	cleanupClose(t, pd)
	ch, err := ctx.NewSharedCompChannel()
	require.NoError(t, err)
	cleanupClose(t, ch)
	cqA, err := ctx.CreateCQ(16, ch, 0)
	require.NoError(t, err)
	cleanupClose(t, cqA) // closed below; this on a failure
	cqB, err := ctx.CreateCQ(16, ch, 0)
	require.NoError(t, err, "a shared channel takes many CQs")
	cleanupClose(t, cqB)
	_, err = cqA.Wait(context.Background(), make([]verbs.WorkCompletion, 1))
	require.ErrorIs(t, err, syscall.EINVAL, "CQ.Wait on a shared channel")
	require.ErrorIs(t, ch.Close(), syscall.EBUSY, "CQs still open")
	private, err := ctx.NewCompChannel()
	require.NoError(t, err)
	cleanupClose(t, private)
	_, err = private.GetEvents(context.Background(), make([]*verbs.CQ, 1))
	require.ErrorIs(t, err, syscall.EINVAL, "GetEvents on a one-CQ channel")
	require.NoError(t, private.Close())

	mr, err := pd.RegMR(4096, verbs.AccessLocalWrite)
	require.NoError(t, err)
	cleanupClose(t, mr)
	a, b := smallRCQP(t, pd, cqA), smallRCQP(t, pd, cqB)
	connectRC(t, ctx, a, b)

	// Nothing armed, nothing queued: the wait ends with the context.
	cqs := make([]*verbs.CQ, 4)
	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	_, err = ch.GetEvents(short, cqs)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)

	sendSeeingEvents(t, ch, cqA, cqB, a, b, mr)
	wcs := make([]verbs.WorkCompletion, 4)
	for id, q := range map[uint64]*verbs.CQ{2: cqA, 1: cqB} {
		n, err := q.Poll(wcs)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Equal(t, id, wcs[0].WRID)
		require.NoError(t, wcs[0].Err())
	}

	// Close wakes a reader.
	errc := make(chan error, 1)
	go func() {
		_, err := ch.GetEvents(context.Background(), cqs)
		errc <- err
	}()
	for _, c := range []interface{ Close() error }{a, b, cqA, cqB, ch} {
		require.NoError(t, c.Close())
	}
	select {
	case err := <-errc:
		require.ErrorIs(t, err, verbs.ErrClosed)
	case <-time.After(10 * time.Second):
		t.Fatal("GetEvents still waiting after Close")
	}
}

// collect waits for exactly n completions, all successful.
func (p *rcPair) collect(t testing.TB, n int) []verbs.WorkCompletion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var out []verbs.WorkCompletion
	for len(out) < n {
		k, err := p.cq.Wait(ctx, p.wcs)
		require.NoError(t, err, "after %d of %d completions", len(out), n)
		for _, wc := range p.wcs[:k] {
			require.NoError(t, wc.Err())
			out = append(out, wc)
		}
	}
	require.Len(t, out, n)
	return out
}

func byID(wcs []verbs.WorkCompletion, id uint64) verbs.WorkCompletion {
	for _, wc := range wcs {
		if wc.WRID == id {
			return wc
		}
	}
	return verbs.WorkCompletion{WRID: ^uint64(0)}
}

func TestVerbsRCLoopback(t *testing.T) {
	ctx := openRXE(t)
	pd, err := ctx.AllocPD()
	require.NoError(t, err)
	cleanupClose(t, pd)
	p := newRCPair(t, ctx, nil, pd)
	src, dst := p.mr.Bytes(), p.peerMR.Bytes()

	t.Run("SendRecv", func(t *testing.T) {
		msg := []byte("hello over soft-RoCE")
		copy(src, msg)
		clear(dst[:64])
		require.NoError(t, p.b.PostRecv([]verbs.RecvWR{{ID: 10, SGL: []verbs.SGE{p.peerMR.SGE(0, 4096)}}}))
		require.NoError(t, p.a.PostSend([]verbs.SendWR{{ID: 11, Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
			SGL: []verbs.SGE{p.mr.SGE(0, len(msg))}}}))
		wcs := p.collect(t, 2)
		recv := byID(wcs, 10)
		require.Equal(t, verbs.WCRecv, recv.Opcode)
		require.Equal(t, uint32(len(msg)), recv.ByteLen)
		require.Equal(t, p.b.Num(), recv.QPNum)
		require.Zero(t, recv.Flags&verbs.WCWithImm)
		require.Equal(t, verbs.WCSend, byID(wcs, 11).Opcode)
		require.Equal(t, msg, dst[:len(msg)])
	})

	t.Run("SendWithImm", func(t *testing.T) {
		require.NoError(t, p.b.PostRecv([]verbs.RecvWR{{ID: 20, SGL: []verbs.SGE{p.peerMR.SGE(0, 64)}}}))
		copy(src, "imm")
		require.NoError(t, p.a.PostSend([]verbs.SendWR{{ID: 21, Opcode: verbs.WRSendWithImm, Imm: 0x12345678,
			Flags: verbs.SendSignaled, SGL: []verbs.SGE{p.mr.SGE(0, 3)}}}))
		recv := byID(p.collect(t, 2), 20)
		require.NotZero(t, recv.Flags&verbs.WCWithImm)
		require.Equal(t, uint32(0x12345678), recv.Imm, "immediate data arrives in host order")
		require.Equal(t, "imm", string(dst[:3]))
	})

	t.Run("RDMAWrite", func(t *testing.T) {
		data := bytes.Repeat([]byte("W"), 3000)
		copy(src[1000:], data)
		clear(dst[2000:6000])
		require.NoError(t, p.a.PostSend([]verbs.SendWR{{ID: 30, Opcode: verbs.WRRDMAWrite, Flags: verbs.SendSignaled,
			SGL: []verbs.SGE{p.mr.SGE(1000, len(data))}, RemoteAddr: p.peerMR.Addr() + 2000, RKey: p.peerMR.RKey()}}))
		wc := p.collect(t, 1)[0]
		require.Equal(t, verbs.WCRDMAWrite, wc.Opcode)
		require.Equal(t, data, dst[2000:5000])
		require.Zero(t, dst[5000], "no byte past the write")
	})

	t.Run("RDMAWriteWithImm", func(t *testing.T) {
		require.NoError(t, p.b.PostRecv([]verbs.RecvWR{{ID: 35}}))
		copy(src, "wimm")
		require.NoError(t, p.a.PostSend([]verbs.SendWR{{ID: 36, Opcode: verbs.WRRDMAWriteWithImm, Imm: 0xCAFEF00D,
			Flags: verbs.SendSignaled, SGL: []verbs.SGE{p.mr.SGE(0, 4)}, RemoteAddr: p.peerMR.Addr() + 100, RKey: p.peerMR.RKey()}}))
		recv := byID(p.collect(t, 2), 35)
		require.Equal(t, verbs.WCRecvRDMAWithImm, recv.Opcode)
		require.Equal(t, uint32(0xCAFEF00D), recv.Imm)
		require.Equal(t, "wimm", string(dst[100:104]))
	})

	t.Run("RDMARead", func(t *testing.T) {
		for i := range 4096 {
			dst[8192+i] = byte(i * 7)
		}
		clear(src[8192 : 8192+4096])
		require.NoError(t, p.a.PostSend([]verbs.SendWR{{ID: 40, Opcode: verbs.WRRDMARead, Flags: verbs.SendSignaled,
			SGL: []verbs.SGE{p.mr.SGE(8192, 4096)}, RemoteAddr: p.peerMR.Addr() + 8192, RKey: p.peerMR.RKey()}}))
		wc := p.collect(t, 1)[0]
		require.Equal(t, verbs.WCRDMARead, wc.Opcode)
		require.Equal(t, dst[8192:8192+4096], src[8192:8192+4096])
	})

	t.Run("Atomics", func(t *testing.T) {
		target := dst[16384 : 16384+8]
		result := src[16384 : 16384+8]
		binary.NativeEndian.PutUint64(target, 5)
		post := func(id uint64, op verbs.WROpcode, cmpAdd, swap uint64) {
			clear(result)
			require.NoError(t, p.a.PostSend([]verbs.SendWR{{ID: id, Opcode: op, Flags: verbs.SendSignaled,
				SGL: []verbs.SGE{p.mr.SGE(16384, 8)}, RemoteAddr: p.peerMR.Addr() + 16384, RKey: p.peerMR.RKey(),
				CompareAdd: cmpAdd, Swap: swap}}))
			p.collect(t, 1)
		}
		post(50, verbs.WRAtomicCmpSwp, 5, 9) // matches: swaps
		require.Equal(t, uint64(5), binary.NativeEndian.Uint64(result), "CAS returns the old value")
		require.Equal(t, uint64(9), binary.NativeEndian.Uint64(target))
		post(51, verbs.WRAtomicCmpSwp, 5, 77) // does not match
		require.Equal(t, uint64(9), binary.NativeEndian.Uint64(result))
		require.Equal(t, uint64(9), binary.NativeEndian.Uint64(target), "failed CAS leaves the target")
		post(52, verbs.WRAtomicFetchAdd, 3, 0)
		require.Equal(t, uint64(9), binary.NativeEndian.Uint64(result), "FAA returns the old value")
		require.Equal(t, uint64(12), binary.NativeEndian.Uint64(target))
	})

	t.Run("InlineSend", func(t *testing.T) {
		require.GreaterOrEqual(t, p.a.Cap().MaxInlineData, uint32(32))
		require.NoError(t, p.b.PostRecv([]verbs.RecvWR{{ID: 60, SGL: []verbs.SGE{p.peerMR.SGE(0, 64)}}}))
		msg := []byte("inline from Go memory")
		require.NoError(t, p.a.PostSend([]verbs.SendWR{{ID: 61, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, Inline: msg}}))
		msg[0] = 'X' // the payload was copied at post time
		recv := byID(p.collect(t, 2), 60)
		require.Equal(t, uint32(len(msg)), recv.ByteLen)
		require.Equal(t, "inline from Go memory", string(dst[:len(msg)]))

		big := make([]byte, p.a.Cap().MaxInlineData+1)
		err := p.a.PostSend([]verbs.SendWR{{ID: 62, Opcode: verbs.WRSend, Inline: big}})
		require.ErrorIs(t, err, syscall.EINVAL)
	})

	t.Run("UnsignaledAndChain", func(t *testing.T) {
		const n = 8
		recvs := make([]verbs.RecvWR, n)
		sends := make([]verbs.SendWR, n)
		for i := range n {
			copy(src[i*100:], fmt.Sprintf("message %d", i))
			recvs[i] = verbs.RecvWR{ID: uint64(100 + i), SGL: []verbs.SGE{p.peerMR.SGE(20000+i*100, 100)}}
			sends[i] = verbs.SendWR{ID: uint64(200 + i), Opcode: verbs.WRSend, SGL: []verbs.SGE{p.mr.SGE(i*100, 9)}}
		}
		sends[n-1].Flags = verbs.SendSignaled // only the last one completes on the send side
		require.NoError(t, p.b.PostRecv(recvs), "one chain of receives")
		require.NoError(t, p.a.PostSend(sends), "one chain of sends")
		wcs := p.collect(t, n+1)
		sendDone := 0
		for _, wc := range wcs {
			if wc.Opcode == verbs.WCSend {
				sendDone++
				require.Equal(t, uint64(200+n-1), wc.WRID)
			}
		}
		require.Equal(t, 1, sendDone, "unsignaled sends give no completion")
		for i := range n {
			require.Equal(t, fmt.Sprintf("message %d", i), string(dst[20000+i*100:20000+i*100+9]))
			require.Equal(t, uint32(9), byID(wcs, uint64(100+i)).ByteLen)
		}
	})

	t.Run("WaitTimeout", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		n, err := p.cq.Wait(ctx, p.wcs)
		require.Zero(t, n)
		require.ErrorIs(t, err, context.DeadlineExceeded)
		var ne net.Error
		require.ErrorAs(t, err, &ne)
		require.True(t, ne.Timeout())
		require.Less(t, time.Since(start), time.Second)
	})

	t.Run("WaitWakesOnCompletion", func(t *testing.T) {
		require.NoError(t, p.b.PostRecv([]verbs.RecvWR{{ID: 70, SGL: []verbs.SGE{p.peerMR.SGE(0, 64)}}}))
		go func() {
			time.Sleep(50 * time.Millisecond)
			p.a.PostSend([]verbs.SendWR{{ID: 71, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, Inline: []byte("late")}})
		}()
		p.collect(t, 2)
	})

	t.Run("WrongTypeAndState", func(t *testing.T) {
		// RTS -> INIT is no transition.
		err := p.a.Modify(&verbs.QPAttr{State: verbs.QPStateInit}, verbs.QPAttrState)
		var me *verbs.MaskError
		require.ErrorAs(t, err, &me)
		require.True(t, me.BadState)
		require.ErrorIs(t, err, syscall.EINVAL)
		// RTS -> RTS with a bit RC does not accept there.
		err = p.a.Modify(&verbs.QPAttr{DestQPNum: 1}, verbs.QPAttrDestQPN)
		require.ErrorAs(t, err, &me)
		require.Equal(t, verbs.QPAttrDestQPN, me.Extra)
		// UD send fields on an RC QP are ignored, but a UD-only check works:
		// a chain longer than the queue is refused with the index.
		long := make([]verbs.SendWR, 2000)
		err = p.a.PostSend(long)
		var pe *verbs.PostError
		require.ErrorAs(t, err, &pe)
		// An opcode this package does not know is refused before the driver.
		err = p.a.PostSend([]verbs.SendWR{{ID: 1, Opcode: verbs.WROpcode(99)}})
		require.ErrorAs(t, err, &pe)
		require.Zero(t, pe.Index)
		// ... also as the second of a chain: it names that one, and none
		// of the chain was posted.
		err = p.a.PostSend([]verbs.SendWR{{ID: 2, Opcode: verbs.WRSend}, {ID: 3, Opcode: verbs.WROpcode(99)}})
		require.ErrorAs(t, err, &pe)
		require.Equal(t, 1, pe.Index)
		require.Zero(t, pe.Posted)
		// The driver refuses the second request of a chain (too many SGEs):
		// the error names it, and the first one was posted.
		require.NoError(t, p.b.PostRecv([]verbs.RecvWR{{ID: 80, SGL: []verbs.SGE{p.peerMR.SGE(0, 64)}}}))
		tooMany := make([]verbs.SGE, p.a.Cap().MaxSendSGE+1)
		for i := range tooMany {
			tooMany[i] = p.mr.SGE(i, 1)
		}
		err = p.a.PostSend([]verbs.SendWR{
			{ID: 81, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, Inline: []byte("first")},
			{ID: 82, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGL: tooMany},
		})
		t.Logf("bad second request: %v", err)
		require.ErrorAs(t, err, &pe)
		require.Equal(t, 1, pe.Index)
		require.Equal(t, 1, pe.Posted)
		require.ErrorIs(t, err, syscall.EINVAL)
		wcs := p.collect(t, 2)
		require.Equal(t, verbs.WCSend, byID(wcs, 81).Opcode)
		// The QP still works.
		qa, _, err := p.a.Query(verbs.QPAttrState)
		require.NoError(t, err)
		require.Equal(t, verbs.QPStateRTS, qa.State)
	})

	t.Run("ZeroAllocs", func(t *testing.T) {
		recv := []verbs.RecvWR{{ID: 1, SGL: []verbs.SGE{p.peerMR.SGE(0, 64)}}}
		send := []verbs.SendWR{{ID: 2, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, SGL: []verbs.SGE{p.mr.SGE(0, 32)}}}
		inline := []verbs.SendWR{{ID: 3, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, Inline: []byte("0123456789")}}
		wcs := p.wcs
		// t.Fatal, not panic: AllocsPerRun runs this on the test's
		// goroutine, and a panic would end every test after this one. A
		// completion that never comes fails it too, not the binary's
		// timeout.
		roundTrip := func(s []verbs.SendWR) {
			if err := p.b.PostRecv(recv); err != nil {
				t.Fatal(err)
			}
			if err := p.a.PostSend(s); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(10 * time.Second)
			for got := 0; got < 2; {
				n, err := p.cq.Poll(wcs)
				if err != nil {
					t.Fatal(err)
				}
				for _, wc := range wcs[:n] {
					if wc.Status != verbs.WCSuccess {
						t.Fatal(wc.Err())
					}
				}
				got += n
				if n == 0 && time.Now().After(deadline) {
					t.Fatalf("%d of 2 completions in 10 s", got)
				}
			}
		}
		require.Zero(t, testing.AllocsPerRun(200, func() { roundTrip(send) }), "PostRecv+PostSend+Poll allocate")
		require.Zero(t, testing.AllocsPerRun(200, func() { roundTrip(inline) }), "inline PostSend allocates")
	})
}

// asyncEventsAndPD opens the soft-RoCE device with its async events and a
// PD, closed at the end.
func asyncEventsAndPD(t *testing.T) (*verbs.Context, <-chan verbs.AsyncEvent, *verbs.PD) {
	t.Helper()
	ctx := openRXE(t)
	events := ctx.AsyncEvents()
	require.NotNil(t, events)
	pd, err := ctx.AllocPD()
	require.NoError(t, err)
	cleanupClose(t, pd)
	return ctx, events, pd
}

func TestVerbsSRQAndLimitEvent(t *testing.T) {
	ctx, events, pd := asyncEventsAndPD(t)
	srq, err := pd.CreateSRQ(verbs.SRQInit{MaxWR: 16, MaxSGE: 1})
	require.NoError(t, err)
	cleanupClose(t, srq) // after the QPs: cleanups run in reverse
	p := newRCPair(t, ctx, srq, pd)

	err = p.b.PostRecv([]verbs.RecvWR{{ID: 1}})
	var te *verbs.TypeError
	require.ErrorAs(t, err, &te, "a QP with an SRQ has no receive queue")
	require.ErrorIs(t, srq.Close(), syscall.EBUSY, "SRQ in use by QPs")

	recvs := make([]verbs.RecvWR, 4)
	for i := range recvs {
		recvs[i] = verbs.RecvWR{ID: uint64(300 + i), SGL: []verbs.SGE{p.peerMR.SGE(i*256, 256)}}
	}
	require.NoError(t, srq.PostRecv(recvs))
	require.NoError(t, srq.Arm(2))

	for i := range 3 {
		require.NoError(t, p.a.PostSend([]verbs.SendWR{{ID: uint64(400 + i), Opcode: verbs.WRSend,
			Flags: verbs.SendSignaled, Inline: []byte(fmt.Sprintf("srq %d", i))}}))
	}
	wcs := p.collect(t, 6)
	for i := range 3 {
		recv := byID(wcs, uint64(300+i))
		require.Equal(t, verbs.WCRecv, recv.Opcode, "receive %d through the SRQ", i)
		require.Equal(t, p.b.Num(), recv.QPNum)
		require.Equal(t, fmt.Sprintf("srq %d", i), string(p.peerMR.Bytes()[i*256:i*256+5]))
	}

	select {
	case ev := <-events:
		t.Logf("async event: %v", ev)
		require.Equal(t, verbs.EventSRQLimitReached, ev.Type)
		require.Same(t, srq, ev.SRQ)
	case <-time.After(5 * time.Second):
		t.Fatal("no SRQ limit event")
	}
}

// TestVerbsAsyncEventNamesItsOwnSRQ: an SRQ destroyed just as the device
// reports an event for it, and a new SRQ made at once (the allocator hands
// it the freed memory), must not get the event. The event was acked as it
// was read and looked up by address only then: the destroy went through in
// between, the new SRQ took the address, and the event named it. cm fails
// the connections of a CQ that an EventCQErr names in the same way.
func TestVerbsAsyncEventNamesItsOwnSRQ(t *testing.T) {
	ctx, events, pd := asyncEventsAndPD(t)
	init := verbs.SRQInit{MaxWR: 16, MaxSGE: 1}
	old, err := pd.CreateSRQ(init)
	require.NoError(t, err)
	cleanupClose(t, old)
	p := newRCPair(t, ctx, old, pd)
	recvs := make([]verbs.RecvWR, 4)
	for i := range recvs {
		recvs[i] = verbs.RecvWR{ID: uint64(i), SGL: []verbs.SGE{p.peerMR.SGE(i*256, 256)}}
	}
	require.NoError(t, old.PostRecv(recvs))
	require.NoError(t, old.Arm(2))

	// Between reading the event and looking it up: destroy the SRQ (its
	// QPs first) and make another. The destroy may wait for the event's
	// ack, so it runs on its own, given a while.
	var fresh *verbs.SRQ
	replaced := make(chan error, 1)
	var once sync.Once
	// On a failure the replacement is waited for and fresh closed, in this
	// test: not left to the leak checks of later ones. The once.Do there
	// returns when the hook has started the replacement or never will.
	var replacing sync.WaitGroup
	t.Cleanup(func() { once.Do(func() {}); replacing.Wait(); fresh.Close() })
	defer faults.Set(func(op string) error {
		if op == "ibv_get_async_event" {
			once.Do(func() {
				replacing.Go(func() {
					err := errors.Join(p.a.Close(), p.b.Close(), old.Close())
					if err == nil {
						fresh, err = pd.CreateSRQ(init)
					}
					replaced <- err
				})
				select {
				case err := <-replaced:
					replaced <- err
				case <-time.After(500 * time.Millisecond):
				}
			})
		}
		return nil
	})()
	for i := range 3 {
		require.NoError(t, p.a.PostSend([]verbs.SendWR{{ID: uint64(i), Opcode: verbs.WRSend, Flags: verbs.SendSignaled, Inline: []byte("limit")}}))
	}
	var ev verbs.AsyncEvent
	select {
	case ev = <-events:
	case <-time.After(5 * time.Second):
		t.Fatal("no SRQ limit event")
	}
	require.NoError(t, <-replaced)
	cleanupClose(t, fresh)
	require.Equal(t, verbs.EventSRQLimitReached, ev.Type)
	require.False(t, ev.SRQ == fresh, "the event named the SRQ made after the destroy of its own")
	require.Same(t, old, ev.SRQ)
}

// requireEventsEnd: the async events channel of a closed wrapper is closed.
func requireEventsEnd(t *testing.T, events <-chan verbs.AsyncEvent) {
	t.Helper()
	select {
	case ev, ok := <-events:
		require.False(t, ok, "event %v after Close; want the channel closed", ev)
	case <-time.After(2 * time.Second):
		t.Fatal("AsyncEvents channel not closed by Close")
	}
}

func TestVerbsClosedContextStopsEvents(t *testing.T) {
	dev := os.Getenv("RXE_DEV")
	if dev == "" {
		t.Skip("no soft-RoCE device (RXE_DEV unset): run through the VM harness")
	}
	requireNoVerbsLeaks(t)
	ctx, err := verbs.OpenDevice(dev)
	require.NoError(t, err)
	ev := ctx.AsyncEvents()
	require.NoError(t, ctx.Close())
	requireEventsEnd(t, ev)
	require.NoError(t, ctx.Close())
	_, err = ctx.AllocPD()
	require.True(t, errors.Is(err, verbs.ErrClosed), "got %v", err)
}

func TestVerbsUDLoopback(t *testing.T) {
	ctx, pd, _, cq, mr := cqSetup(t, false, 64, 8192)
	gid := roceGID(t, ctx, rxeIP(t))

	const qkey = 0x11111111
	mk := func() *verbs.QP {
		qp, err := pd.CreateQP(verbs.QPInit{Type: verbs.QPTypeUD, SendCQ: cq,
			Cap: verbs.QPCap{MaxSendWR: 8, MaxRecvWR: 8, MaxSendSGE: 1, MaxRecvSGE: 1, MaxInlineData: 64}})
		require.NoError(t, err)
		cleanupClose(t, qp)
		attr := verbs.QPAttr{State: verbs.QPStateInit, PortNum: verbsPort, QKey: qkey}
		require.NoError(t, qp.Modify(&attr, verbs.RequiredMask(verbs.QPTypeUD, verbs.QPStateReset, verbs.QPStateInit)))
		// An address vector is not a UD QP attribute.
		err = qp.Modify(&verbs.QPAttr{State: verbs.QPStateRTR}, verbs.QPAttrState|verbs.QPAttrAV)
		var me *verbs.MaskError
		require.ErrorAs(t, err, &me)
		require.NoError(t, qp.Modify(&verbs.QPAttr{State: verbs.QPStateRTR}, verbs.QPAttrState))
		attr = verbs.QPAttr{State: verbs.QPStateRTS, SQPSN: 1}
		require.NoError(t, qp.Modify(&attr, verbs.RequiredMask(verbs.QPTypeUD, verbs.QPStateRTR, verbs.QPStateRTS)))
		return qp
	}
	a, b := mk(), mk()
	ah, err := pd.CreateAH(verbs.AHAttr{IsGlobal: true, PortNum: verbsPort,
		GRH: verbs.GlobalRoute{DGID: gid.GID, SGIDIndex: uint8(gid.Index), HopLimit: 64}})
	require.NoError(t, err)
	cleanupClose(t, ah)
	require.ErrorIs(t, pd.Close(), syscall.EBUSY)

	// UD receives start with a 40-byte GRH area.
	require.NoError(t, b.PostRecv([]verbs.RecvWR{{ID: 1, SGL: []verbs.SGE{mr.SGE(0, 40+256)}}}))
	err = a.PostSend([]verbs.SendWR{{ID: 2, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, Inline: []byte("datagram")}})
	var pe *verbs.PostError
	require.ErrorAs(t, err, &pe, "UD send without an AH")
	err = a.PostSend([]verbs.SendWR{{ID: 2, Opcode: verbs.WRRDMAWrite, AH: ah}})
	require.ErrorAs(t, err, &pe, "no RDMA on UD")
	require.NoError(t, a.PostSend([]verbs.SendWR{{ID: 2, Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
		Inline: []byte("datagram"), AH: ah, RemoteQPN: b.Num(), RemoteQKey: qkey}}))
	p := &rcPair{cq: cq, wcs: make([]verbs.WorkCompletion, 8)}
	wcs := p.collect(t, 2)
	recv := byID(wcs, 1)
	require.Equal(t, uint32(40+8), recv.ByteLen)
	require.Equal(t, a.Num(), recv.SrcQP)
	require.NotZero(t, recv.Flags&verbs.WCWithGRH)
	require.Equal(t, "datagram", string(mr.Bytes()[40:48]))

	// A chain naming one AH twice: PostSend holds each AH until the post
	// returns (the driver reads it there), once per AH, and both go out.
	require.NoError(t, b.PostRecv([]verbs.RecvWR{{ID: 3, SGL: []verbs.SGE{mr.SGE(0, 40+256)}}, {ID: 4, SGL: []verbs.SGE{mr.SGE(512, 40+256)}}}))
	ud := func(id uint64, ah *verbs.AH) verbs.SendWR {
		return verbs.SendWR{ID: id, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, Inline: []byte("twice"), AH: ah, RemoteQPN: b.Num(), RemoteQKey: qkey}
	}
	require.NoError(t, a.PostSend([]verbs.SendWR{ud(5, ah), ud(6, ah)}))
	wcs = p.collect(t, 4)
	for _, id := range []uint64{3, 4, 5, 6} {
		require.Equal(t, id, byID(wcs, id).WRID, "completion of request %d", id)
	}

	// An AH closed while another goroutine posts with it: Close waits for
	// a post under way and succeeds, and later posts fail cleanly.
	ah2, err := pd.CreateAH(verbs.AHAttr{IsGlobal: true, PortNum: verbsPort,
		GRH: verbs.GlobalRoute{DGID: gid.GID, SGIDIndex: uint8(gid.Index), HopLimit: 64}})
	require.NoError(t, err)
	cleanupClose(t, ah2) // closed below; this on a failure
	started, posted := make(chan struct{}), make(chan error, 1)
	var once sync.Once
	start := func() { once.Do(func() { close(started) }) }
	go func() {
		var err error
		for i := uint64(0); err == nil; i++ {
			if err = a.PostSend([]verbs.SendWR{ud(100+i, ah2)}); err == nil {
				_, err = p.cq.Wait(context.Background(), p.wcs) // the send's completion (b posts no receive)
			}
			if i == 20 {
				start()
			}
		}
		start()
		posted <- err
	}()
	<-started
	require.NoError(t, ah2.Close())
	select {
	case err := <-posted:
		require.ErrorAs(t, err, &pe, "a post after Close: %v", err)
		require.ErrorIs(t, err, syscall.EINVAL)
	case <-time.After(10 * time.Second):
		t.Fatal("posting goroutine still running 10 s after the AH closed")
	}
}

func TestVerbsCloseWakesWait(t *testing.T) {
	ctx := openRXE(t)
	ch, err := ctx.NewCompChannel()
	require.NoError(t, err)
	cleanupClose(t, ch)
	cq, err := ctx.CreateCQ(8, ch, 0)
	require.NoError(t, err)
	cleanupClose(t, cq) // closed below; this on a failure
	done := make(chan error, 1)
	go func() {
		_, err := cq.Wait(context.Background(), make([]verbs.WorkCompletion, 4))
		done <- err
	}()
	time.Sleep(100 * time.Millisecond)
	require.NoError(t, cq.Close())
	select {
	case err := <-done:
		require.ErrorIs(t, err, verbs.ErrClosed)
	case <-time.After(3 * time.Second):
		t.Fatal("Close did not wake Wait")
	}
}

func TestVerbsXRCQPsOnRXE(t *testing.T) {
	ctx := openRXE(t)
	pd, err := ctx.AllocPD()
	require.NoError(t, err)
	cleanupClose(t, pd)
	cq, err := ctx.CreateCQ(8, nil, 0)
	require.NoError(t, err)
	cleanupClose(t, cq)
	// rxe has no XRC QP type: the driver refuses, and nothing leaks.
	qp, err := pd.CreateQP(verbs.QPInit{Type: verbs.QPTypeXRCSend, SendCQ: cq, Cap: verbs.QPCap{MaxSendWR: 4, MaxSendSGE: 1}})
	t.Logf("XRC_SEND QP on rxe: %v", err)
	require.ErrorIs(t, err, verbs.ErrNotSupported)
	require.Nil(t, qp)
	_, err = cq.Wait(context.Background(), make([]verbs.WorkCompletion, 1))
	require.ErrorIs(t, err, syscall.EINVAL, "no channel")
}

// TestVerbsPollOrArm: PollOrArm on an empty CQ arms it (the next
// completion raises an event on its channel); with completions there it
// returns them. On a closed CQ it fails at once.
func TestVerbsPollOrArm(t *testing.T) {
	ctx, pd, ch, cq, mr := cqSetup(t, true, 16, 4096)
	a, b := smallRCQP(t, pd, cq), smallRCQP(t, pd, cq)
	connectRC(t, ctx, a, b)

	wcs := make([]verbs.WorkCompletion, 4)
	n, armed, err := cq.PollOrArm(wcs)
	require.NoError(t, err)
	require.Zero(t, n)
	require.True(t, armed, "an empty CQ is armed")

	require.NoError(t, b.PostRecv([]verbs.RecvWR{{ID: 1, SGL: []verbs.SGE{mr.SGE(0, 64)}}}))
	require.NoError(t, a.PostSend([]verbs.SendWR{{ID: 2, Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{mr.SGE(64, 16)}}}))
	wait, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cqs := make([]*verbs.CQ, 4)
	events := func() {
		t.Helper()
		k, err := ch.GetEvents(wait, cqs)
		require.NoError(t, err, "the armed CQ raises an event")
		require.Equal(t, []*verbs.CQ{cq}, cqs[:k])
	}
	events()
	got := map[uint64]verbs.WCStatus{}
	for len(got) < 2 {
		n, armed, err := cq.PollOrArm(wcs)
		require.NoError(t, err)
		if n == 0 {
			require.True(t, armed)
			events()
		}
		for _, wc := range wcs[:n] {
			got[wc.WRID] = wc.Status
		}
	}
	require.Equal(t, map[uint64]verbs.WCStatus{1: verbs.WCSuccess, 2: verbs.WCSuccess}, got)

	closed, err := ctx.CreateCQ(4, nil, 0)
	require.NoError(t, err)
	require.NoError(t, closed.Close())
	_, _, err = closed.PollOrArm(wcs)
	require.ErrorIs(t, err, verbs.ErrClosed)
}

// TestVerbsPollSpin: PollSpin on an empty CQ spins for about its budget and
// reports nothing; with a completion on the way it returns it without
// waiting out the budget; on a closed CQ it fails at once.
func TestVerbsPollSpin(t *testing.T) {
	ctx := openRXE(t)
	pd, err := ctx.AllocPD()
	require.NoError(t, err)
	cleanupClose(t, pd)
	p := newRCPair(t, ctx, nil, pd)

	start := time.Now()
	n, err := p.cq.PollSpin(p.wcs, 2*time.Millisecond)
	require.NoError(t, err)
	require.Zero(t, n)
	require.GreaterOrEqual(t, time.Since(start), 2*time.Millisecond, "an empty poll spins out its budget")

	require.NoError(t, p.b.PostRecv([]verbs.RecvWR{{ID: 1, SGL: []verbs.SGE{p.peerMR.SGE(0, 64)}}}))
	require.NoError(t, p.a.PostSend([]verbs.SendWR{{ID: 2, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, Inline: []byte("spin")}}))
	got := map[uint64]verbs.WCStatus{}
	for deadline := time.Now().Add(10 * time.Second); len(got) < 2 && time.Now().Before(deadline); {
		// A budget far longer than the test: only a completion ends it.
		n, err := p.cq.PollSpin(p.wcs, time.Hour)
		require.NoError(t, err)
		for _, wc := range p.wcs[:n] {
			got[wc.WRID] = wc.Status
		}
	}
	require.Equal(t, map[uint64]verbs.WCStatus{1: verbs.WCSuccess, 2: verbs.WCSuccess}, got)

	cq, err := ctx.CreateCQ(4, nil, 0)
	require.NoError(t, err)
	require.NoError(t, cq.Close())
	_, err = cq.PollSpin(p.wcs, time.Hour)
	require.ErrorIs(t, err, verbs.ErrClosed)
}

// BenchmarkVerbsSendRecv measures one send/receive round trip through the
// binding on the loopback pair (meaningful as a ratio against ib_send_lat in
// the same guest, not as an absolute figure under TCG).
func BenchmarkVerbsSendRecv(b *testing.B) {
	ctx := openRXE(b)
	pd, err := ctx.AllocPD()
	require.NoError(b, err)
	cleanupClose(b, pd)
	p := newRCPair(b, ctx, nil, pd)
	recv := []verbs.RecvWR{{ID: 1, SGL: []verbs.SGE{p.peerMR.SGE(0, 64)}}}
	send := []verbs.SendWR{{ID: 2, Opcode: verbs.WRSend, Flags: verbs.SendSignaled, Inline: []byte("0123456789abcdef")}}
	b.ReportAllocs()
	for b.Loop() {
		if err := p.b.PostRecv(recv); err != nil {
			b.Fatal(err)
		}
		if err := p.a.PostSend(send); err != nil {
			b.Fatal(err)
		}
		for got := 0; got < 2; {
			n, err := p.cq.Poll(p.wcs)
			if err != nil {
				b.Fatal(err)
			}
			got += n
		}
	}
}

// TestObjectTraceNamesCreators: with tracing on (TestMain), a leak report
// names the function that made each live verbs object and CM id, every
// kind the bindings count, and forgets each one once it is closed.
func TestObjectTraceNamesCreators(t *testing.T) {
	ctx := openRXE(t)
	require.True(t, objtrace.Enabled(), "TestMain turns tracing on")
	// Each is closed below, the cleanups on a failure before.
	pd, err := ctx.AllocPD()
	require.NoError(t, err)
	cleanupClose(t, pd)
	cc, err := ctx.NewCompChannel()
	require.NoError(t, err)
	cleanupClose(t, cc)
	cq, err := ctx.CreateCQ(4, cc, 0)
	require.NoError(t, err)
	cleanupClose(t, cq)
	mr, err := pd.RegMR(4096, verbs.AccessLocalWrite)
	require.NoError(t, err)
	cleanupClose(t, mr)
	qp, err := pd.CreateQP(verbs.QPInit{Type: verbs.QPTypeRC, SendCQ: cq, RecvCQ: cq,
		Cap: verbs.QPCap{MaxSendWR: 1, MaxRecvWR: 1, MaxSendSGE: 1, MaxRecvSGE: 1}})
	require.NoError(t, err)
	cleanupClose(t, qp)
	ch, err := rdmacm.NewEventChannel()
	require.NoError(t, err)
	cleanupClose(t, ch)
	id, err := ch.CreateID(rdmacm.PortSpaceTCP, verbs.QPTypeRC)
	require.NoError(t, err)
	cleanupClose(t, id)

	const here = "integration.TestObjectTraceNamesCreators "
	made := []string{"verbs context", "PD", "completion channel", "CQ", "MR", "QP", "CM event channel", "CM id"}
	r := objtrace.Report()
	for _, kind := range made {
		require.Regexp(t, "(?m)^1 "+kind+" created at\n(\t.*\n)*\t.*"+regexp.QuoteMeta(here), r, "report:\n%s", r)
	}
	for _, o := range []interface{ Close() error }{id, ch, qp, mr, cq, cc, pd} { // dependents first
		require.NoError(t, o.Close())
	}
	r = objtrace.Report()
	for _, kind := range made[1:] { // the context closes in the cleanup
		require.NotRegexp(t, "(?m)^1 "+kind+" created at\n(\t.*\n)*\t.*"+regexp.QuoteMeta(here), r, "report:\n%s", r)
	}
}

// sendAcked posts a receive on b and a 16-byte send from a, both with
// work request id, and polls sendCQ (a's) until the send completes: once b
// acknowledged it, after b's receive completion was queued.
func sendAcked(t *testing.T, a, b *verbs.QP, sendCQ *verbs.CQ, mr *verbs.MR, id uint64) {
	t.Helper()
	require.NoError(t, b.PostRecv([]verbs.RecvWR{{ID: id, SGL: []verbs.SGE{mr.SGE(0, 64)}}}))
	require.NoError(t, a.PostSend([]verbs.SendWR{{ID: id, Opcode: verbs.WRSend, Flags: verbs.SendSignaled,
		SGL: []verbs.SGE{mr.SGE(64, 16)}}}))
	wcs := make([]verbs.WorkCompletion, 1)
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := sendCQ.Poll(wcs)
		require.NoError(t, err)
		if n > 0 {
			require.Equal(t, verbs.WCSuccess, wcs[0].Status)
			return
		}
		require.True(t, time.Now().Before(deadline), "send %d never completed", id)
		time.Sleep(time.Millisecond)
	}
}

// TestVerbsWaitWithEndedContextLooks: a Wait whose context has ended
// still returns the completions already queued, and fails with the
// context's error only on an empty CQ: a caller may take that error for an
// empty CQ (xrc's receive loop does, after a poll with a deadline).
func TestVerbsWaitWithEndedContextLooks(t *testing.T) {
	vctx := openRXE(t)
	pd, err := vctx.AllocPD()
	require.NoError(t, err)
	cleanupClose(t, pd)
	ch, err := vctx.NewCompChannel()
	require.NoError(t, err)
	cleanupClose(t, ch)
	recvCQ, err := vctx.CreateCQ(8, ch, 0)
	require.NoError(t, err)
	cleanupClose(t, recvCQ)
	sendCQ, err := vctx.CreateCQ(8, nil, 0)
	require.NoError(t, err)
	cleanupClose(t, sendCQ)
	mr, err := pd.RegMR(4096, verbs.AccessLocalWrite)
	require.NoError(t, err)
	cleanupClose(t, mr)
	a, b := smallRCQP(t, pd, sendCQ), smallRCQP(t, pd, recvCQ)
	connectRC(t, vctx, a, b)

	ended, cancel := context.WithCancel(context.Background())
	cancel()
	wcs := make([]verbs.WorkCompletion, 4)
	for i := range 20 { // a turn and an ended context were picked at random, half the time
		sendAcked(t, a, b, sendCQ, mr, uint64(i)) // b's receive completion is queued
		n, err := recvCQ.Wait(ended, wcs)
		require.NoError(t, err, "round %d: a queued completion, an ended context", i)
		require.Equal(t, 1, n)
		require.Equal(t, uint64(i), wcs[0].WRID)
	}
	_, err = recvCQ.Wait(ended, wcs)
	require.ErrorIs(t, err, context.Canceled, "nothing queued")
}

// TestVerbsGetEventsWithEndedContextLooks: GetEvents, as CQ.Wait, returns
// the events a shared channel already holds when its context has ended,
// and the context's error only on a channel with none (it picked between
// its turn and the ended context at random).
func TestVerbsGetEventsWithEndedContextLooks(t *testing.T) {
	vctx, pd, ch, recvCQ, mr := cqSetup(t, true, 8, 4096)
	sendCQ, err := vctx.CreateCQ(8, nil, 0)
	require.NoError(t, err)
	cleanupClose(t, sendCQ)
	a, b := smallRCQP(t, pd, sendCQ), smallRCQP(t, pd, recvCQ)
	connectRC(t, vctx, a, b)

	ended, cancel := context.WithCancel(context.Background())
	cancel()
	wcs := make([]verbs.WorkCompletion, 4)
	cqs := make([]*verbs.CQ, 4)
	for i := range 20 { // half the rounds took the ended context before
		require.NoError(t, recvCQ.ReqNotify(false))
		// b's receive completion, and the event it raised, are queued; the
		// pause is room for a device that hands the event on from a
		// deferred task.
		sendAcked(t, a, b, sendCQ, mr, uint64(i))
		time.Sleep(50 * time.Millisecond)
		n, err := ch.GetEvents(ended, cqs)
		require.NoError(t, err, "round %d: an event queued, an ended context", i)
		require.Equal(t, 1, n)
		require.Same(t, recvCQ, cqs[0])
		n, err = recvCQ.Poll(wcs)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Equal(t, uint64(i), wcs[0].WRID)
	}
	_, err = ch.GetEvents(ended, cqs)
	require.ErrorIs(t, err, context.Canceled, "nothing queued")
}

// TestVerbsSRQNumAfterClose: a closed SRQ's number is refused, as every
// method of a closed object is (it returned the old number: one a peer
// might be sent, and another SRQ may have by then; found by a review).
func TestVerbsSRQNumAfterClose(t *testing.T) {
	ctx := openRXE(t)
	pd, err := ctx.AllocPD()
	require.NoError(t, err)
	cleanupClose(t, pd)
	srq, err := pd.CreateSRQ(verbs.SRQInit{MaxWR: 4, MaxSGE: 1})
	require.NoError(t, err)
	cleanupClose(t, srq) // closed below; this on a failure
	_, err = srq.Num()
	if !errors.Is(err, verbs.ErrNotSupported) {
		require.NoError(t, err)
	}
	require.NoError(t, srq.Close())
	_, err = srq.Num()
	require.ErrorIs(t, err, verbs.ErrClosed)
}

// TestVerbsAsyncErrBesideAsyncEvents: AsyncErr may be called while another
// goroutine starts the async events (it read the subscription unlocked;
// the race detector, test/run-tests.sh's VM_RACE build of test/integration,
// flags it; found by a review).
func TestVerbsAsyncErrBesideAsyncEvents(t *testing.T) {
	ctx := openRXE(t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 1000 {
			if err := ctx.AsyncErr(); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	defer func() { <-done }() // also on a failure: a t.Error after the test ended panics
	require.NotNil(t, ctx.AsyncEvents(), "%v", ctx.AsyncErr())
}
