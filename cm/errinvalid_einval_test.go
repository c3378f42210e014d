package cm

import (
	"errors"
	"fmt"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/verbs"
)

// ErrInvalid's doc: "It is os.ErrInvalid, which the devices' EINVAL errors
// match as well." A device's EINVAL reaches cm's caller as a *verbs.OpError
// around the errno (package rdmacm's too), bare or wrapped by cm: a QP the
// device refuses with and without inline data (createInline, on the device
// path of Dial and Accept), a registration, a QP attribute mask the driver
// would refuse (verbs.MaskError). None matched ErrInvalid: syscall.Errno
// maps EINVAL to no os error, and OpError.Is knew only ErrNotSupported and
// the deadline. Other errnos must still not match.
func TestDocDeviceEINVALMatchesErrInvalid(t *testing.T) {
	einval := func(op string) error { return &verbs.OpError{Op: op, Addr: "rxe0", Err: syscall.EINVAL} }
	qpRefused := createInline(64, func(int) error { return einval("ibv_create_qp_ex") })
	for name, err := range map[string]error{
		"ibv_reg_mr EINVAL":                 einval("ibv_reg_mr"),
		"createInline, EINVAL twice":        qpRefused,
		"wrapped by cm":                     opError("dial", nil, fmt.Errorf("cm: %w", einval("ibv_create_cq"))),
		"ibv_modify_qp, a driver's refusal": &verbs.OpError{Op: "ibv_modify_qp", Err: &verbs.MaskError{Type: verbs.QPTypeRC, From: verbs.QPStateInit, To: verbs.QPStateRTR}},
	} {
		require.ErrorIs(t, err, syscall.EINVAL, name)
		require.ErrorIs(t, err, ErrInvalid, "%s: %v", name, err)
	}
	for _, errno := range []syscall.Errno{syscall.ENOMEM, syscall.EAGAIN, syscall.EOPNOTSUPP, syscall.ENODEV} {
		err := &verbs.OpError{Op: "ibv_create_qp_ex", Err: errno}
		require.False(t, errors.Is(err, ErrInvalid), "%v", err)
	}
}
