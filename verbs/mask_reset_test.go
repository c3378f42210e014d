package verbs_test

import (
	"testing"

	"github.com/goxrc/goxrc/verbs"
)

// RESET->ERR is no transition: the kernel's qp_state_table lists only RESET
// and INIT after RESET, and ib_modify_qp_is_ok refuses it. The tables took
// it for one (any state to ERR), so Modify passed it to the driver, which
// failed it with a bare EINVAL (found by review).
func TestResetToErrIsNotATransition(t *testing.T) {
	for _, typ := range []verbs.QPType{verbs.QPTypeRC, verbs.QPTypeUC, verbs.QPTypeUD, verbs.QPTypeXRCSend, verbs.QPTypeXRCRecv} {
		if m := verbs.AllowedMask(typ, verbs.QPStateReset, verbs.QPStateErr); m != 0 {
			t.Errorf("%v: AllowedMask(RESET, ERR) = %v, want 0", typ, m)
		}
		if err := verbs.CheckMask(typ, verbs.QPStateReset, &verbs.QPAttr{State: verbs.QPStateErr}, verbs.QPAttrState); err == nil {
			t.Errorf("%v: CheckMask(RESET->ERR) = nil, want an error", typ)
		}
		for _, from := range []verbs.QPState{verbs.QPStateInit, verbs.QPStateRTR, verbs.QPStateRTS, verbs.QPStateErr} {
			if err := verbs.CheckMask(typ, from, &verbs.QPAttr{State: verbs.QPStateErr}, verbs.QPAttrState); err != nil {
				t.Errorf("%v: CheckMask(%v->ERR) = %v, want nil", typ, from, err)
			}
		}
		if err := verbs.CheckMask(typ, verbs.QPStateReset, &verbs.QPAttr{State: verbs.QPStateReset}, verbs.QPAttrState); err != nil {
			t.Errorf("%v: CheckMask(RESET->RESET) = %v, want nil", typ, err)
		}
	}
}
