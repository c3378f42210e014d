package cm

import (
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/goxrc/goxrc/verbs"
)

// cachingDevice is a device in use, with no verbs objects but a pool on
// regs and pairs cached QPs (empty ones, whose Close does nothing), entered
// in devices' map as name until the test ends.
func cachingDevice(t *testing.T, name string, regs *fakeRegs, pairs int) *device {
	t.Helper()
	d := &device{name: name, pool: newPoolOn(regs.register), refs: 1, qps: map[qpShape][]cachedQP{}}
	s := qpShape{sendSlots: 4, recvSlots: 4}
	for range pairs {
		d.qps[s] = append(d.qps[s], cachedQP{qp: &verbs.QP{}, cq: &verbs.CQ{}, since: time.Now()})
	}
	d.cachedQPs = pairs
	globalStats.cachedQPs.Add(int64(pairs))
	devices.Lock()
	if devices.m == nil {
		devices.m = map[string]*device{}
	}
	require.Nil(t, devices.m[name], "a device named %s is open", name)
	devices.m[name] = d
	devices.Unlock()
	t.Cleanup(func() {
		devices.Lock()
		delete(devices.m, name)
		devices.Unlock()
		d.dropQPs()
		require.NoError(t, d.pool.close())
	})
	return d
}

// Cached QPs and CQs pin lockable memory as registrations do: a
// registration (or CQ, or QP) refused for want of it takes them back, on
// its own device and on the others. reclaimLockedMemory dropped only the
// pools' kept registrations and idle devices, leaving up to maxCachedQPs
// pairs a device (found by review).
func TestReclaimLockedMemoryDropsCachedQPs(t *testing.T) {
	regs := &fakeRegs{}
	before := GlobalStats().CachedQueuePairs
	d := cachingDevice(t, "test-reclaim-d", regs, 1)
	other := cachingDevice(t, "test-reclaim-other", regs, 2)
	require.Equal(t, before+3, GlobalStats().CachedQueuePairs)

	require.True(t, d.reclaimLockedMemory(), "the cached pairs were given back")
	require.Zero(t, d.cachedQPs, "the device's own cached pairs")
	require.Zero(t, other.cachedQPs, "another device's cached pairs")
	require.Empty(t, d.qps)
	require.Empty(t, other.qps)
	require.Equal(t, before, GlobalStats().CachedQueuePairs)
	require.False(t, d.reclaimLockedMemory(), "nothing left to give back")
}

// A CQ or QP that the kernel refuses for want of lockable memory is made
// again once cm gave back what it keeps (newRDMATransport, through
// withReclaim, as a Region's registration): they failed at once, with
// cached pairs holding the memory.
func TestWithReclaimRetriesAfterENOMEM(t *testing.T) {
	regs := &fakeRegs{}
	d := cachingDevice(t, "test-retry-d", regs, 0)
	other := cachingDevice(t, "test-retry-other", regs, 1)
	calls := 0
	create := func() error { // as the kernel, while other's pair pins the memory
		calls++
		if other.cachedQPs > 0 {
			return &verbs.OpError{Op: "ibv_create_cq", Err: syscall.ENOMEM}
		}
		return nil
	}
	require.NoError(t, d.withReclaim(create))
	require.Equal(t, 2, calls, "tried once more after the reclaim")

	// Nothing left to give back: the kernel's error, after one try.
	calls = 0
	err := d.withReclaim(func() error { calls++; return syscall.ENOMEM })
	require.ErrorIs(t, err, syscall.ENOMEM)
	require.Equal(t, 1, calls)

	// Other errors take nothing back.
	other.dropQPs()
	kept := cachingDevice(t, "test-retry-kept", regs, 1)
	einval := errors.New("ibv_create_qp: invalid argument")
	require.Equal(t, einval, d.withReclaim(func() error { return einval }))
	require.Equal(t, 1, kept.cachedQPs, "reclaimed for another error")
}
