package verbs

import (
	"fmt"
	"syscall"
)

// The attribute masks each QP type needs for each state transition, as the
// IB specification and the kernel's qp_state_table define them. XRC differs
// from RC: the INI side has no responder (no MAX_DEST_RD_ATOMIC, no
// MIN_RNR_TIMER), the TGT side no requester (no MAX_QP_RD_ATOMIC, RETRY_CNT,
// RNR_RETRY). Checking them in Go turns a bare EINVAL from the driver into an
// error that says which bits are wrong.

type transition struct{ from, to QPState }

type maskRule struct{ req, opt QPAttrMask }

const (
	rtsOptUC  = QPAttrCurState | QPAttrAccessFlags | QPAttrAltPath | QPAttrPathMigState
	rtsOptRC  = rtsOptUC | QPAttrMinRNRTimer
	sqdSqdRC  = QPAttrPort | QPAttrAV | QPAttrTimeout | QPAttrRetryCnt | QPAttrRNRRetry | QPAttrMaxQPRdAtomic | QPAttrMaxDestRdAtomic | QPAttrAltPath | QPAttrAccessFlags | QPAttrPKeyIndex | QPAttrMinRNRTimer | QPAttrPathMigState
	sqdSqdINI = sqdSqdRC &^ (QPAttrMaxDestRdAtomic | QPAttrMinRNRTimer)
	sqdSqdTGT = sqdSqdRC &^ (QPAttrMaxQPRdAtomic | QPAttrRetryCnt | QPAttrRNRRetry)
)

var maskTable = map[QPType]map[transition]maskRule{
	QPTypeUD: {
		{QPStateReset, QPStateInit}: {req: QPAttrPKeyIndex | QPAttrPort | QPAttrQKey},
		{QPStateInit, QPStateInit}:  {opt: QPAttrPKeyIndex | QPAttrPort | QPAttrQKey},
		{QPStateInit, QPStateRTR}:   {opt: QPAttrPKeyIndex | QPAttrQKey},
		{QPStateRTR, QPStateRTS}:    {req: QPAttrSQPSN, opt: QPAttrCurState | QPAttrQKey},
		{QPStateRTS, QPStateRTS}:    {opt: QPAttrCurState | QPAttrQKey},
		{QPStateRTS, QPStateSQD}:    {opt: QPAttrEnSQDAsyncNotify},
		{QPStateSQD, QPStateRTS}:    {opt: QPAttrCurState | QPAttrQKey},
		{QPStateSQD, QPStateSQD}:    {opt: QPAttrPKeyIndex | QPAttrQKey},
		{QPStateSQE, QPStateRTS}:    {opt: QPAttrCurState | QPAttrQKey},
	},
	QPTypeUC: {
		{QPStateReset, QPStateInit}: {req: QPAttrPKeyIndex | QPAttrPort | QPAttrAccessFlags},
		{QPStateInit, QPStateInit}:  {opt: QPAttrPKeyIndex | QPAttrPort | QPAttrAccessFlags},
		{QPStateInit, QPStateRTR}: {req: QPAttrAV | QPAttrPathMTU | QPAttrDestQPN | QPAttrRQPSN,
			opt: QPAttrAltPath | QPAttrAccessFlags | QPAttrPKeyIndex},
		{QPStateRTR, QPStateRTS}: {req: QPAttrSQPSN, opt: rtsOptUC},
		{QPStateRTS, QPStateRTS}: {opt: rtsOptUC},
		{QPStateRTS, QPStateSQD}: {opt: QPAttrEnSQDAsyncNotify},
		{QPStateSQD, QPStateRTS}: {opt: rtsOptUC},
		{QPStateSQD, QPStateSQD}: {opt: QPAttrAV | QPAttrAltPath | QPAttrAccessFlags | QPAttrPKeyIndex | QPAttrPathMigState},
		{QPStateSQE, QPStateRTS}: {opt: QPAttrCurState | QPAttrAccessFlags},
	},
	QPTypeRC: {
		{QPStateReset, QPStateInit}: {req: QPAttrPKeyIndex | QPAttrPort | QPAttrAccessFlags},
		{QPStateInit, QPStateInit}:  {opt: QPAttrPKeyIndex | QPAttrPort | QPAttrAccessFlags},
		{QPStateInit, QPStateRTR}: {req: QPAttrAV | QPAttrPathMTU | QPAttrDestQPN | QPAttrRQPSN | QPAttrMaxDestRdAtomic | QPAttrMinRNRTimer,
			opt: QPAttrAltPath | QPAttrAccessFlags | QPAttrPKeyIndex},
		{QPStateRTR, QPStateRTS}: {req: QPAttrTimeout | QPAttrRetryCnt | QPAttrRNRRetry | QPAttrSQPSN | QPAttrMaxQPRdAtomic,
			opt: rtsOptRC},
		{QPStateRTS, QPStateRTS}: {opt: rtsOptRC},
		{QPStateRTS, QPStateSQD}: {opt: QPAttrEnSQDAsyncNotify},
		{QPStateSQD, QPStateRTS}: {opt: rtsOptRC},
		{QPStateSQD, QPStateSQD}: {opt: sqdSqdRC},
	},
	QPTypeXRCSend: {
		{QPStateReset, QPStateInit}: {req: QPAttrPKeyIndex | QPAttrPort | QPAttrAccessFlags},
		{QPStateInit, QPStateInit}:  {opt: QPAttrPKeyIndex | QPAttrPort | QPAttrAccessFlags},
		{QPStateInit, QPStateRTR}: {req: QPAttrAV | QPAttrPathMTU | QPAttrDestQPN | QPAttrRQPSN,
			opt: QPAttrAltPath | QPAttrAccessFlags | QPAttrPKeyIndex},
		{QPStateRTR, QPStateRTS}: {req: QPAttrTimeout | QPAttrRetryCnt | QPAttrRNRRetry | QPAttrSQPSN | QPAttrMaxQPRdAtomic,
			opt: rtsOptUC},
		{QPStateRTS, QPStateRTS}: {opt: rtsOptUC},
		{QPStateRTS, QPStateSQD}: {opt: QPAttrEnSQDAsyncNotify},
		{QPStateSQD, QPStateRTS}: {opt: rtsOptUC},
		{QPStateSQD, QPStateSQD}: {opt: sqdSqdINI},
	},
	QPTypeXRCRecv: {
		{QPStateReset, QPStateInit}: {req: QPAttrPKeyIndex | QPAttrPort | QPAttrAccessFlags},
		{QPStateInit, QPStateInit}:  {opt: QPAttrPKeyIndex | QPAttrPort | QPAttrAccessFlags},
		{QPStateInit, QPStateRTR}: {req: QPAttrAV | QPAttrPathMTU | QPAttrDestQPN | QPAttrRQPSN | QPAttrMaxDestRdAtomic | QPAttrMinRNRTimer,
			opt: QPAttrAltPath | QPAttrAccessFlags | QPAttrPKeyIndex},
		{QPStateRTR, QPStateRTS}: {req: QPAttrTimeout | QPAttrSQPSN, opt: rtsOptRC},
		{QPStateRTS, QPStateRTS}: {opt: rtsOptRC},
		{QPStateRTS, QPStateSQD}: {opt: QPAttrEnSQDAsyncNotify},
		{QPStateSQD, QPStateRTS}: {opt: rtsOptRC},
		{QPStateSQD, QPStateSQD}: {opt: sqdSqdTGT},
	},
}

func lookupRule(t QPType, from, to QPState) (maskRule, bool) {
	if to == QPStateReset || to == QPStateErr {
		// Any state may go to RESET, and any but RESET to ERR, with the
		// state bit alone (the kernel's qp_state_table has no
		// RESET->ERR: ib_modify_qp_is_ok refuses it).
		if _, ok := maskTable[t]; ok && from <= QPStateErr && !(from == QPStateReset && to == QPStateErr) {
			return maskRule{}, true
		}
		return maskRule{}, false
	}
	r, ok := maskTable[t][transition{from, to}]
	return r, ok
}

// RequiredMask returns the attribute mask that Modify needs for QP type t to
// go from one state to another, the QPAttrState bit included when the state
// changes. It returns 0 for a transition the type does not have.
func RequiredMask(t QPType, from, to QPState) QPAttrMask {
	r, ok := lookupRule(t, from, to)
	if !ok {
		return 0
	}
	if from != to {
		r.req |= QPAttrState
	}
	return r.req
}

// AllowedMask returns every attribute bit that Modify accepts for QP type t
// from one state to another (required and optional), or 0 for a transition
// the type does not have.
func AllowedMask(t QPType, from, to QPState) QPAttrMask {
	r, ok := lookupRule(t, from, to)
	if !ok {
		return 0
	}
	return r.req | r.opt | QPAttrState
}

// MaskError reports a Modify whose mask does not fit the QP type and the
// transition. It matches syscall.EINVAL with errors.Is.
type MaskError struct {
	Type     QPType
	From, To QPState
	Missing  QPAttrMask // required bits not given
	Extra    QPAttrMask // bits the transition does not accept
	BadState bool       // the type has no such transition
}

func (e *MaskError) Error() string {
	if e.BadState {
		return fmt.Sprintf("%v QP cannot go from %v to %v", e.Type, e.From, e.To)
	}
	s := fmt.Sprintf("%v QP %v->%v:", e.Type, e.From, e.To)
	if e.Missing != 0 {
		s += " missing " + e.Missing.String()
	}
	if e.Extra != 0 {
		s += " not allowed " + e.Extra.String()
	}
	return s
}

// Is matches syscall.EINVAL, the kernel's answer to such a mask.
func (e *MaskError) Is(target error) bool { return target == syscall.EINVAL }

// CheckMask validates mask for a Modify of a QP of type t in state from. The
// target state is attr.State when mask has QPAttrState, from otherwise. It
// returns nil or a *MaskError.
func CheckMask(t QPType, from QPState, attr *QPAttr, mask QPAttrMask) error {
	to := from
	if mask&QPAttrState != 0 {
		to = attr.State
	}
	r, ok := lookupRule(t, from, to)
	if !ok {
		return &MaskError{Type: t, From: from, To: to, BadState: true}
	}
	req := r.req
	if from != to {
		req |= QPAttrState
	}
	e := &MaskError{Type: t, From: from, To: to,
		Missing: req &^ mask,
		Extra:   mask &^ (r.req | r.opt | QPAttrState),
	}
	if e.Missing != 0 || e.Extra != 0 {
		return e
	}
	return nil
}

// TypeError reports an operation the QP's type does not have, such as
// PostRecv on an XRC_SEND QP. It matches syscall.EINVAL with errors.Is.
type TypeError struct {
	Op   string
	Type QPType
	Why  string
}

func (e *TypeError) Error() string {
	return fmt.Sprintf("%s on %v QP: %s", e.Op, e.Type, e.Why)
}

// Is matches syscall.EINVAL, the kernel's answer to such a request.
func (e *TypeError) Is(target error) bool { return target == syscall.EINVAL }

// PostError says which work request of a chain failed (Index) and how
// many were posted (Posted, those before Index, or none): the driver posts
// in order up to the one it refuses, and this package's own checks refuse
// a chain before any of it is posted. Both are -1 when the driver failed
// the post without naming a request: how much of the chain went is then
// unknown.
type PostError struct {
	Index  int
	Posted int
	Err    error
}

func (e *PostError) Error() string {
	if e.Index < 0 {
		return fmt.Sprintf("work request unknown (the driver named none): %v", e.Err)
	}
	return fmt.Sprintf("work request %d: %v", e.Index, e.Err)
}

// Unwrap returns the post's error, so errors.Is sees its errno.
func (e *PostError) Unwrap() error { return e.Err }

// checkOpcode refuses opcodes this package has no fields for, and opcodes
// the QP type cannot carry. Some drivers (soft-RoCE) accept any opcode at
// post time and then fail the QP, so catching them here keeps the QP alive.
func checkOpcode(t QPType, op WROpcode) error {
	switch op {
	case WRSend, WRSendWithImm:
		return nil
	case WRRDMAWrite, WRRDMAWriteWithImm:
		if t != QPTypeUD {
			return nil
		}
	case WRRDMARead, WRAtomicCmpSwp, WRAtomicFetchAdd:
		if t != QPTypeUD && t != QPTypeUC {
			return nil
		}
	default:
		return &TypeError{Op: "PostSend", Type: t, Why: fmt.Sprintf("unknown opcode %v", op)}
	}
	return &TypeError{Op: "PostSend", Type: t, Why: fmt.Sprintf("opcode %v is not valid on this QP type", op)}
}
