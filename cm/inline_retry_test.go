package cm

import (
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/verbs"
)

// A QP the device refuses is created again with less inline data only where
// the refusal is about the inline size, EINVAL (what rxe's rxe_qp_chk_cap
// and mlx5's mlx5_calc_sq_size answer a size they cannot give). Any failure
// was tried again without inline data: an ENOMEM or EAGAIN made a second
// QP creation that could not help (and, for ENOMEM, one that may succeed
// with no inline data where withReclaim would have freed memory for the QP
// asked for), and the retry's error replaced the first.
func TestCreateQPInlineRetryOnlyForEINVAL(t *testing.T) {
	qpErr := func(errno syscall.Errno) error {
		return &verbs.OpError{Op: "ibv_create_qp_ex", Addr: "rxe0 RC", Err: errno}
	}
	einval := qpErr(syscall.EINVAL)
	for _, tc := range []struct {
		name    string
		results []error // create's answers in turn
		calls   []int   // the inline sizes asked, in turn
		want    []error // the error matches each (none: nil)
	}{
		{"ok", []error{nil}, []int{64}, nil},
		{"inline too big", []error{einval, nil}, []int{64, 32}, nil},
		{"ENOMEM", []error{qpErr(syscall.ENOMEM), nil}, []int{64}, []error{syscall.ENOMEM}},
		{"EAGAIN", []error{qpErr(syscall.EAGAIN), nil}, []int{64}, []error{syscall.EAGAIN}},
		{"EINVAL at every size", []error{einval, einval, einval, einval, einval, einval, einval, einval},
			[]int{64, 32, 16, 8, 4, 2, 1, 0}, []error{syscall.EINVAL}},
		{"EINVAL, then ENOMEM", []error{einval, qpErr(syscall.ENOMEM)}, []int{64, 32}, []error{syscall.EINVAL, syscall.ENOMEM}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var calls []int
			err := createInline(64, func(inline int) error {
				calls = append(calls, inline)
				return tc.results[len(calls)-1]
			})
			t.Logf("%v", err)
			require.Equal(t, tc.calls, calls, "the inline sizes asked")
			if tc.want == nil {
				require.NoError(t, err)
				return
			}
			for _, w := range tc.want {
				require.ErrorIs(t, err, w)
			}
			var oe *verbs.OpError
			require.ErrorAs(t, err, &oe)
			require.Equal(t, tc.results[0], oe, "the first error is the one errors.As finds")
		})
	}
	// No inline data asked: nothing to go without.
	calls := 0
	err := createInline(0, func(int) error { calls++; return einval })
	require.ErrorIs(t, err, syscall.EINVAL)
	require.Equal(t, 1, calls)
}

// A device that refuses an inline size still inlines what it can: the
// retry went straight to none, so WithInlineThreshold(1024) on soft-RoCE,
// which inlines a few hundred bytes, sent almost nothing inline. Each QP
// finds the size for itself (an EINVAL may be of another limit).
func TestCreateQPInlineHalvesToWhatTheDeviceTakes(t *testing.T) {
	const most = 400 // what this device inlines at most
	var asked []int
	create := func(inline int) error {
		asked = append(asked, inline)
		if inline > most {
			return &verbs.OpError{Op: "ibv_create_qp_ex", Err: syscall.EINVAL}
		}
		return nil
	}
	require.NoError(t, createInline(1024, create))
	require.Equal(t, []int{1024, 512, 256}, asked)
	asked = nil
	require.NoError(t, createInline(64, create))
	require.Equal(t, []int{64}, asked)
}
