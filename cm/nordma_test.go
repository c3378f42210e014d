//go:build linux && cgo

package cm

import (
	"context"
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

// Where the kernel has no RDMA CM, Dial and Listen say so with
// ErrNotSupported and point to the in-memory fabric (they said "no such
// device" about /dev/infiniband/rdma_cm).
func TestNoRDMAIsNotSupported(t *testing.T) {
	if _, err := os.Stat("/dev/infiniband/rdma_cm"); err == nil {
		t.Skip("this machine has an RDMA CM")
	}
	ctx := context.Background()
	_, err := Dial(ctx, "10.1.2.3:7000")
	require.ErrorIs(t, err, ErrNotSupported)
	require.ErrorContains(t, err, "WithFabric")
	_, err = Listen(ctx, ":7000")
	require.ErrorIs(t, err, ErrNotSupported)
	// With a device named, an unspecified address is the device's own,
	// which was looked up first, and failed with "no such RDMA device".
	_, err = Listen(ctx, ":7000", WithDevice("mlx5_0"))
	require.ErrorIs(t, err, ErrNotSupported)
	_, err = Dial(ctx, "10.1.2.3:7000", WithDevice("mlx5_0"))
	require.ErrorIs(t, err, ErrNotSupported)
}
