package verbs_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/verbs"
)

// The host has no RDMA: these tests cover the no-device paths, closed and
// nil objects, and the pure-Go tables. The device paths are exercised in
// test/integration on soft-RoCE.

func TestDevicesWithoutRDMA(t *testing.T) {
	devs, err := verbs.Devices()
	if err != nil {
		// No uverbs at all (or no cgo): a clear "not supported".
		require.ErrorIs(t, err, verbs.ErrNotSupported)
		var oe *verbs.OpError
		require.ErrorAs(t, err, &oe)
		t.Logf("Devices: %v", err)
		return
	}
	t.Logf("devices: %+v", devs)
	for _, d := range devs { // where a machine has RDMA after all
		require.NotEmpty(t, d.Name)
	}
}

func TestOpenUnknownDevice(t *testing.T) {
	ctx, err := verbs.OpenDevice("nope")
	require.Error(t, err)
	require.Nil(t, ctx)
	require.Contains(t, err.Error(), "nope")
	var oe *verbs.OpError
	require.ErrorAs(t, err, &oe)
	require.Equal(t, "nope", oe.Addr)
	if haveVerbs {
		require.ErrorIs(t, err, syscall.ENODEV)
		var errno syscall.Errno
		require.ErrorAs(t, err, &errno)
		require.Equal(t, syscall.ENODEV, errno, "the errno errors.As finds")
	}
	// On a machine with no RDMA at all it also matches ErrNotSupported, as
	// Devices' error does (it said so only in its text before); where
	// devices exist, an unknown name is not "not supported".
	if _, derr := verbs.Devices(); errors.Is(derr, verbs.ErrNotSupported) {
		require.ErrorIs(t, err, verbs.ErrNotSupported)
	} else {
		require.NotErrorIs(t, err, verbs.ErrNotSupported)
	}
}

// Every method of a nil or zero-value object fails cleanly (ErrClosed with
// cgo, ErrNotSupported without) and Close is a no-op.
func TestNilAndZeroObjects(t *testing.T) {
	wantErr := func(err error) {
		t.Helper()
		require.Error(t, err)
		if haveVerbs {
			require.ErrorIs(t, err, verbs.ErrClosed)
		}
	}
	for _, c := range []*verbs.Context{nil, new(verbs.Context)} {
		require.Equal(t, "", c.Name())
		_, err := c.QueryDevice()
		wantErr(err)
		_, err = c.QueryPort(1)
		wantErr(err)
		_, err = c.GIDs(1)
		wantErr(err)
		require.Nil(t, c.AsyncEvents())
		_, err = c.AllocPD()
		wantErr(err)
		_, err = c.NewCompChannel()
		wantErr(err)
		_, err = c.CreateCQ(1, nil, 0)
		wantErr(err)
		_, err = c.OpenXRCD("", verbs.XRCDCreate)
		wantErr(err)
		_, err = c.CreateXRCRecvQP(nil)
		wantErr(err)
		_, err = c.OpenQP(nil, 1)
		wantErr(err)
		require.NoError(t, c.Close())
	}
	for _, p := range []*verbs.PD{nil, new(verbs.PD)} {
		_, err := p.RegMR(4096, verbs.AccessLocalWrite)
		wantErr(err)
		_, err = p.CreateAH(verbs.AHAttr{})
		wantErr(err)
		_, err = p.CreateQP(verbs.QPInit{Type: verbs.QPTypeRC})
		wantErr(err)
		_, err = p.CreateSRQ(verbs.SRQInit{MaxWR: 1, MaxSGE: 1})
		wantErr(err)
		_, err = p.CreateXRCSRQ(nil, nil, verbs.SRQInit{})
		wantErr(err)
		require.NoError(t, p.Close())
	}
	for _, m := range []*verbs.MR{nil, new(verbs.MR)} {
		require.Nil(t, m.Bytes())
		require.Zero(t, m.LKey())
		require.Zero(t, m.RKey())
		require.Zero(t, m.Addr())
		require.Zero(t, m.Len())
		require.NoError(t, m.Close())
	}
	for _, q := range []*verbs.CQ{nil, new(verbs.CQ)} {
		_, err := q.Poll(make([]verbs.WorkCompletion, 4))
		wantErr(err)
		wantErr(q.ReqNotify(false))
		_, err = q.Wait(context.Background(), make([]verbs.WorkCompletion, 4))
		wantErr(err)
		require.NoError(t, q.Close())
	}
	for _, q := range []*verbs.QP{nil, new(verbs.QP)} {
		require.Zero(t, q.Num())
		wantErr(q.Modify(&verbs.QPAttr{State: verbs.QPStateInit}, verbs.QPAttrState))
		_, _, err := q.Query(verbs.QPAttrState)
		wantErr(err)
		wantErr(q.PostSend([]verbs.SendWR{{Opcode: verbs.WRSend}}))
		wantErr(q.PostRecv([]verbs.RecvWR{{ID: 1}}))
		require.NoError(t, q.Close())
		require.NoError(t, q.Close())
	}
	for _, s := range []*verbs.SRQ{nil, new(verbs.SRQ)} {
		_, err := s.Num()
		wantErr(err)
		wantErr(s.Arm(1))
		wantErr(s.PostRecv([]verbs.RecvWR{{ID: 1}}))
		require.NoError(t, s.Close())
	}
	require.NoError(t, (*verbs.XRCD)(nil).Close())
	require.NoError(t, new(verbs.XRCD).Close())
	require.NoError(t, (*verbs.AH)(nil).Close())
	require.NoError(t, (*verbs.CompChannel)(nil).Close())
	require.True(t, verbs.Counts().IsZero(), "%+v", verbs.Counts())
}

func TestMaskTables(t *testing.T) {
	const (
		rst  = verbs.QPStateReset
		ini  = verbs.QPStateInit
		rtr  = verbs.QPStateRTR
		rts  = verbs.QPStateRTS
		av   = verbs.QPAttrAV
		mdra = verbs.QPAttrMaxDestRdAtomic
		mrnr = verbs.QPAttrMinRNRTimer
		mqra = verbs.QPAttrMaxQPRdAtomic
	)
	// RC needs both halves.
	rcRTR := verbs.RequiredMask(verbs.QPTypeRC, ini, rtr)
	require.Equal(t, verbs.QPAttrState|av|verbs.QPAttrPathMTU|verbs.QPAttrDestQPN|verbs.QPAttrRQPSN|mdra|mrnr, rcRTR)
	require.Equal(t, verbs.QPAttrState|verbs.QPAttrTimeout|verbs.QPAttrRetryCnt|verbs.QPAttrRNRRetry|verbs.QPAttrSQPSN|mqra,
		verbs.RequiredMask(verbs.QPTypeRC, rtr, rts))
	require.Equal(t, verbs.QPAttrState|verbs.QPAttrPKeyIndex|verbs.QPAttrPort|verbs.QPAttrAccessFlags,
		verbs.RequiredMask(verbs.QPTypeRC, rst, ini))

	// INI: no responder resources.
	for _, to := range []verbs.QPState{rtr, rts} {
		from := to - 1
		allowed := verbs.AllowedMask(verbs.QPTypeXRCSend, from, to)
		require.NotZero(t, allowed)
		require.Zero(t, allowed&(mdra|mrnr), "XRC_SEND %v->%v allows %v", from, to, allowed)
	}
	require.Equal(t, rcRTR&^(mdra|mrnr), verbs.RequiredMask(verbs.QPTypeXRCSend, ini, rtr))
	// TGT: no requester resources.
	for _, to := range []verbs.QPState{rtr, rts} {
		allowed := verbs.AllowedMask(verbs.QPTypeXRCRecv, to-1, to)
		require.Zero(t, allowed&(mqra|verbs.QPAttrRetryCnt|verbs.QPAttrRNRRetry), "XRC_RECV allows %v", allowed)
	}
	require.Equal(t, verbs.QPAttrState|verbs.QPAttrTimeout|verbs.QPAttrSQPSN, verbs.RequiredMask(verbs.QPTypeXRCRecv, rtr, rts))
	// UD: QKEY at INIT, never an address vector.
	require.NotZero(t, verbs.RequiredMask(verbs.QPTypeUD, rst, ini)&verbs.QPAttrQKey)
	for _, tr := range [][2]verbs.QPState{{rst, ini}, {ini, rtr}, {rtr, rts}, {rts, rts}} {
		require.Zero(t, verbs.AllowedMask(verbs.QPTypeUD, tr[0], tr[1])&(av|verbs.QPAttrDestQPN|verbs.QPAttrPathMTU))
	}
	require.Equal(t, verbs.QPAttrState|verbs.QPAttrSQPSN, verbs.RequiredMask(verbs.QPTypeUD, rtr, rts))
	// Any state to RESET, and any but RESET to ERR, takes the state bit
	// alone (TestResetToErrIsNotATransition).
	for _, typ := range []verbs.QPType{verbs.QPTypeRC, verbs.QPTypeUD, verbs.QPTypeXRCSend, verbs.QPTypeXRCRecv} {
		for from := rst; from < verbs.QPStateErr; from++ {
			if from != rst {
				require.Equal(t, verbs.QPAttrState, verbs.RequiredMask(typ, from, verbs.QPStateErr))
			}
			require.Equal(t, verbs.QPAttrState, verbs.AllowedMask(typ, from, verbs.QPStateReset))
		}
	}
	// Transitions that do not exist.
	require.Zero(t, verbs.AllowedMask(verbs.QPTypeRC, rts, ini))
	require.Zero(t, verbs.AllowedMask(verbs.QPTypeRC, rst, rts))
	require.Zero(t, verbs.AllowedMask(verbs.QPTypeRC, verbs.QPStateSQE, rts), "RC has no SQE")
	require.Zero(t, verbs.AllowedMask(verbs.QPType(77), rst, ini))
}

func TestCheckMask(t *testing.T) {
	attr := &verbs.QPAttr{State: verbs.QPStateRTR}
	full := verbs.RequiredMask(verbs.QPTypeRC, verbs.QPStateInit, verbs.QPStateRTR)
	require.NoError(t, verbs.CheckMask(verbs.QPTypeRC, verbs.QPStateInit, attr, full))
	require.NoError(t, verbs.CheckMask(verbs.QPTypeRC, verbs.QPStateInit, attr, full|verbs.QPAttrPKeyIndex))

	err := verbs.CheckMask(verbs.QPTypeRC, verbs.QPStateInit, attr, full&^verbs.QPAttrMinRNRTimer)
	var me *verbs.MaskError
	require.ErrorAs(t, err, &me)
	require.Equal(t, verbs.QPAttrMinRNRTimer, me.Missing)
	require.ErrorIs(t, err, syscall.EINVAL)
	require.Contains(t, err.Error(), "missing MIN_RNR_TIMER")

	// The mask rdma_init_qp_attr gives an RC QP is wrong for an INI QP.
	err = verbs.CheckMask(verbs.QPTypeXRCSend, verbs.QPStateInit, attr, full)
	require.ErrorAs(t, err, &me)
	require.Equal(t, verbs.QPAttrMaxDestRdAtomic|verbs.QPAttrMinRNRTimer, me.Extra)
	require.Contains(t, err.Error(), "XRC_SEND QP INIT->RTR: not allowed MIN_RNR_TIMER|MAX_DEST_RD_ATOMIC")

	err = verbs.CheckMask(verbs.QPTypeRC, verbs.QPStateRTS, &verbs.QPAttr{State: verbs.QPStateInit}, verbs.QPAttrState)
	require.ErrorAs(t, err, &me)
	require.True(t, me.BadState)
	require.Equal(t, "RC QP cannot go from RTS to INIT", me.Error())

	// Without the state bit the QP stays where it is: RTS->RTS.
	require.NoError(t, verbs.CheckMask(verbs.QPTypeRC, verbs.QPStateRTS, &verbs.QPAttr{}, verbs.QPAttrMinRNRTimer))
	require.Error(t, verbs.CheckMask(verbs.QPTypeXRCSend, verbs.QPStateRTS, &verbs.QPAttr{}, verbs.QPAttrMinRNRTimer))
}

func TestStrings(t *testing.T) {
	require.Equal(t, "1024", verbs.MTU1024.String())
	require.Equal(t, 4096, verbs.MTU4096.Bytes())
	require.Equal(t, 0, verbs.MTU(9).Bytes())
	require.Equal(t, "RTS", verbs.QPStateRTS.String())
	require.Equal(t, "QPState(42)", verbs.QPState(42).String())
	require.Equal(t, "XRC_SEND", verbs.QPTypeXRCSend.String())
	require.Equal(t, "XRC_RECV", verbs.QPTypeXRCRecv.String())
	require.Equal(t, "SRQ_LIMIT_REACHED", verbs.EventSRQLimitReached.String())
	require.Equal(t, "QP_FATAL", verbs.EventQPFatal.String())
	require.Equal(t, "COMM_EST", verbs.EventCommEst.String())
	require.Equal(t, "PORT_ACTIVE", verbs.EventPortActive.String())
	require.Equal(t, "WQ_FATAL", verbs.EventWQFatal.String())
	require.Equal(t, "AsyncEventType(99)", verbs.AsyncEventType(99).String())
	require.Equal(t, "PORT_ERR port 1", verbs.AsyncEvent{Type: verbs.EventPortErr, Port: 1}.String())
	require.Equal(t, "QP_FATAL QP 0x11", verbs.AsyncEvent{Type: verbs.EventQPFatal, QPNum: 0x11}.String())
	require.Equal(t, "work request flushed", verbs.WCWRFlushErr.String())
	require.Equal(t, "STATE|AV|DEST_QPN", (verbs.QPAttrState | verbs.QPAttrAV | verbs.QPAttrDestQPN).String())
	require.Equal(t, "0", verbs.QPAttrMask(0).String())
	require.Equal(t, "PORT|0x80000000", (verbs.QPAttrPort | 1<<31).String())
	require.Equal(t, "iWARP", verbs.TransportIWARP.String())
	g := verbs.GID{10: 0xff, 11: 0xff, 12: 10, 13: 77, 14: 0, 15: 1}
	require.Equal(t, "10.77.0.1", g.String())
	require.True(t, g.IP().Equal(net.ParseIP("10.77.0.1")))
}

// opErr is the error a call named op on addr returns for err.
func opErr(op, addr string, err error) error { return &verbs.OpError{Op: op, Addr: addr, Err: err} }

func TestErrors(t *testing.T) {
	err := opErr("ibv_open_xrcd", "rxe0", syscall.EOPNOTSUPP)
	require.ErrorIs(t, err, verbs.ErrNotSupported)
	require.ErrorIs(t, err, syscall.EOPNOTSUPP)
	require.Equal(t, "ibv_open_xrcd rxe0: operation not supported", err.Error())
	require.NotErrorIs(t, opErr("x", "", syscall.EINVAL), verbs.ErrNotSupported)
	var ne net.Error
	require.ErrorAs(t, opErr("wait", "", os.ErrDeadlineExceeded), &ne)
	require.True(t, ne.Timeout())
	// A context's deadline is a timeout as net.Conn reports one.
	ctxErr := opErr("wait", "", fmt.Errorf("waiting: %w", context.DeadlineExceeded))
	require.ErrorIs(t, ctxErr, os.ErrDeadlineExceeded)
	require.ErrorIs(t, ctxErr, context.DeadlineExceeded)
	require.ErrorAs(t, ctxErr, &ne)
	require.True(t, ne.Timeout())
	require.NotErrorIs(t, opErr("wait", "", context.Canceled), os.ErrDeadlineExceeded)

	pe := &verbs.PostError{Index: 3, Err: syscall.ENOMEM}
	wrapped := opErr("ibv_post_send", "qp", pe)
	var got *verbs.PostError
	require.ErrorAs(t, wrapped, &got)
	require.Equal(t, 3, got.Index)
	require.ErrorIs(t, wrapped, syscall.ENOMEM)

	te := &verbs.TypeError{Op: "PostRecv", Type: verbs.QPTypeXRCSend, Why: "send only"}
	require.ErrorIs(t, te, syscall.EINVAL)
	require.Equal(t, "PostRecv on XRC_SEND QP: send only", te.Error())

	wc := verbs.WorkCompletion{WRID: 7, Status: verbs.WCWRFlushErr, QPNum: 0x20}
	var ce *verbs.CompletionError
	require.ErrorAs(t, wc.Err(), &ce)
	require.True(t, ce.Flushed())
	require.True(t, strings.Contains(wc.Err().Error(), "flushed"))
	require.NoError(t, (&verbs.WorkCompletion{}).Err())
	require.False(t, errors.Is(wc.Err(), verbs.ErrClosed))
}

func TestCounts(t *testing.T) {
	c := verbs.Counts()
	require.True(t, c.IsZero(), "%+v", c)
	require.False(t, verbs.ObjectCounts{AHs: 1}.IsZero())
}
