package model

import (
	"syscall"
	"testing"

	"github.com/goxrc/goxrc/internal/kernel"
	"github.com/goxrc/goxrc/verbs"
)

// Rule (the seam's PostSend: "RTS, or ERR where everything is flushed;
// EINVAL before RTS"): an INI that went to ERR from INIT or RTR never
// reached RTS, and the real seam (internal/kernel/real, qpObj.rts) refuses
// its posts with EINVAL, as it does once the INI is reset, until a move to
// RTS. The model took them and flushed them, so the engine could count on
// flush completions that the real seam never gives. One that reached RTS
// before its ERR still flushes.
func TestModelPostAfterERRNeedsRTSFirst(t *testing.T) {
	for _, tc := range []struct {
		name string
		up   verbs.QPState // how far the INI got before ERR
		want syscall.Errno // 0: posted and flushed
	}{
		{"from INIT", verbs.QPStateInit, syscall.EINVAL},
		{"from RTR", verbs.QPStateRTR, syscall.EINVAL},
		{"from RTS", verbs.QPStateRTS, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, a, b := twoNodes(t, ReuseNever)
			sa, sb := newSide(t, a, domainFile(t)), newSide(t, b, domainFile(t))
			l := listen(t, sb.p, kernel.ExchangeXRC)
			k := physRequest(t, sa, sb, l)
			ini, c, s := k.ini, k.aid, k.pid
			if tc.up == verbs.QPStateInit {
				ok(t, sa.p.TransitionQP(ini, verbs.QPStateInit, c))
			} else {
				tgt, tgtQPN, err := sb.p.CreateTGT(sb.d)
				ok(t, err)
				ok(t, sb.p.TransitionQP(tgt, verbs.QPStateRTR, s))
				ok(t, sb.p.Accept(s, tgtQPN, nil))
				event(t, sa.p, c, kernel.EventConnectResponse)
				ok(t, sa.p.TransitionQP(ini, tc.up, c))
			}
			ok(t, sa.p.TransitionQP(ini, verbs.QPStateErr, 0))
			err := sa.p.PostSend(ini, []kernel.SendWR{{WRID: 7, RemoteSRQN: sb.srqn, Payload: []byte("x")}})
			if tc.want != 0 {
				if !isErrno(err, tc.want) {
					t.Fatalf("post on an INI in ERR that never reached RTS: %v, want %v", err, tc.want)
				}
				return
			}
			ok(t, err)
			var out [1]kernel.SendCompletion
			must[int](t)(sa.p.PollSend(ctxT(t), ini, out[:]))
			if out[0].WRID != 7 || out[0].Status != verbs.WCWRFlushErr {
				t.Fatalf("completion %+v, want WRID 7 flushed", out[0])
			}
		})
	}
}
