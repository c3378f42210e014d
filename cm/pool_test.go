package cm

import (
	"fmt"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// fakeRegs registers Go memory and counts what is registered, so the
// pool's bookkeeping can be checked without a device.
type fakeRegs struct {
	made, live, liveBytes int
	limit                 int // the most bytes registered at once; 0: none
}

type fakeReg struct {
	r        *fakeRegs
	buf      []byte
	closed   bool
	refusals int // Closes to fail before one succeeds, as a device may
}

func (f *fakeReg) Bytes() []byte { return f.buf }
func (f *fakeReg) Addr() uint64  { return uint64(uintptr(unsafe.Pointer(&f.buf[0]))) }
func (f *fakeReg) LKey() uint32  { return 1 }
func (f *fakeReg) Close() error {
	if f.refusals > 0 {
		f.refusals--
		return syscall.EBUSY
	}
	if f.closed {
		return fmt.Errorf("registration of %d bytes closed twice", len(f.buf))
	}
	f.closed = true
	f.r.live--
	f.r.liveBytes -= len(f.buf)
	return nil
}

func (r *fakeRegs) register(size int) (registration, error) {
	if r.limit > 0 && r.liveBytes+size > r.limit {
		return nil, syscall.ENOMEM
	}
	r.made++
	r.live++
	r.liveBytes += size
	return &fakeReg{r: r, buf: make([]byte, size)}, nil
}

// testPool is a pool on fakeRegs whose clock the test moves.
func testPool(t *testing.T) (*regPool, *fakeRegs, *time.Time) {
	regs := &fakeRegs{}
	p := newPoolOn(regs.register)
	now := time.Unix(1000, 0)
	p.now = func() time.Time { return now }
	p.idle = time.Hour // trimIdle runs when the test calls it
	t.Cleanup(func() {
		require.NoError(t, p.close())
		require.Zero(t, regs.live, "registrations left after close")
	})
	return p, regs, &now
}

func TestPoolCarvesChunksAndReusesBlocks(t *testing.T) {
	p, regs, _ := testPool(t)
	a, err := p.get(100) // class 128
	require.NoError(t, err)
	require.Len(t, a.buf, 128)
	b, err := p.get(128)
	require.NoError(t, err)
	require.Equal(t, 1, regs.made, "two blocks of one class come from one chunk")
	require.NotEqual(t, a.addr, b.addr)
	require.NoError(t, p.put(a))
	c, err := p.get(65)
	require.NoError(t, err)
	require.Equal(t, a.addr, c.addr, "a freed block is taken again")
	require.Equal(t, 1, regs.made)
	require.NoError(t, p.put(b))
	require.NoError(t, p.put(c))
}

func TestPoolKeepsBigRegistrations(t *testing.T) {
	p, regs, _ := testPool(t)
	const eight = 8 << 20
	before := GlobalStats()
	a, err := p.get(eight)
	require.NoError(t, err)
	require.Len(t, a.buf, eight)
	require.NotNil(t, a.own, "over poolMaxBlock a block is a registration of its own")
	require.NoError(t, p.put(a))
	require.Equal(t, 1, regs.live, "a freed big block stays registered")
	require.Equal(t, int64(eight), GlobalStats().BufferBytesKept-before.BufferBytesKept)

	b, err := p.get(eight - 100) // the same 1 MiB class
	require.NoError(t, err)
	require.Equal(t, a.addr, b.addr, "the kept registration is taken again")
	require.Equal(t, 1, regs.made)
	require.Equal(t, before.BufferBytesKept, GlobalStats().BufferBytesKept)

	c, err := p.get(eight + 1) // the next class: a new registration
	require.NoError(t, err)
	require.Len(t, c.buf, 9<<20)
	require.Equal(t, 2, regs.made)
	require.NoError(t, p.put(b))
	require.NoError(t, p.put(c))
	require.Equal(t, 2, regs.live)
}

func TestPoolDropsIdleBigRegistrations(t *testing.T) {
	p, regs, now := testPool(t)
	a, err := p.get(2 << 20)
	require.NoError(t, err)
	b, err := p.get(3 << 20)
	require.NoError(t, err)
	require.NoError(t, p.put(a))
	*now = now.Add(p.idle / 2)
	require.NoError(t, p.put(b))

	*now = now.Add(p.idle / 2) // a's time is up, not b's
	p.trimIdle()
	require.Equal(t, 1, regs.live)
	require.Equal(t, 3<<20, regs.liveBytes, "the older registration went, the younger stays")
	require.NotNil(t, p.trim, "a trim is due for the one left")

	*now = now.Add(p.idle / 2)
	p.trimIdle()
	require.Zero(t, regs.live)
	require.Zero(t, p.keptBytes)
	require.Nil(t, p.trim, "nothing left to trim")
}

func TestPoolTrimTimerFires(t *testing.T) {
	regs := &fakeRegs{}
	p := newPoolOn(regs.register)
	p.idle = time.Millisecond
	b, err := p.get(2 << 20)
	require.NoError(t, err)
	require.NoError(t, p.put(b))
	require.Eventually(t, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return regs.live == 0
	}, 10*time.Second, time.Millisecond, "the idle registration was never dropped")
	require.NoError(t, p.close())
}

func TestPoolBoundsKeptBytes(t *testing.T) {
	p, regs, _ := testPool(t)
	const size = 48 << 20 // three exceed bigCacheBytes
	var blocks []regBlock
	for range 3 {
		b, err := p.get(size)
		require.NoError(t, err)
		blocks = append(blocks, b)
	}
	for _, b := range blocks {
		require.NoError(t, p.put(b))
	}
	require.LessOrEqual(t, p.keptBytes, bigCacheBytes)
	require.Equal(t, 2, regs.live, "the oldest kept registration went over the bound")

	huge, err := p.get(bigCacheBytes + 1)
	require.NoError(t, err)
	require.NoError(t, p.put(huge))
	require.Equal(t, 2, regs.live, "a registration over the whole bound is not kept")
}

func TestPoolGivesBackKeptOnENOMEM(t *testing.T) {
	p, regs, _ := testPool(t)
	regs.limit = 10 << 20
	a, err := p.get(8 << 20)
	require.NoError(t, err)
	require.NoError(t, p.put(a))
	b, err := p.get(4 << 20) // 8 + 4 over the limit: the kept 8 MiB go
	require.NoError(t, err)
	require.Equal(t, 1, regs.live)
	_, err = p.get(8 << 20) // over the limit with nothing kept: the error
	require.ErrorIs(t, err, syscall.ENOMEM)
	require.NoError(t, p.put(b))

	// Other memory on the device asks the pool to give back what it keeps.
	require.Equal(t, 1, regs.live)
	require.True(t, p.dropKept())
	require.Zero(t, regs.live)
	require.False(t, p.dropKept(), "nothing left to give back")
}

// The memory lock limit is the process's: a registration refused on one
// device's pool takes back what another keeps (reclaim, which cm points at
// every other device's pool and the idle devices), then is made.
func TestPoolReclaimsOnENOMEM(t *testing.T) {
	p, regs, _ := testPool(t)
	other := newPoolOn(regs.register) // another device's pool, on the same limit
	regs.limit = 10 << 20
	kept, err := other.get(8 << 20)
	require.NoError(t, err)
	require.NoError(t, other.put(kept))
	calls := 0
	p.reclaim = func() bool {
		calls++
		// Called without p's lock: reclaiming takes other pools' locks,
		// and their own refused registrations take p's.
		require.True(t, p.mu.TryLock(), "reclaim called with the pool locked")
		p.mu.Unlock()
		return other.dropKept()
	}
	small, err := p.get(64) // fits beside the kept 8 MiB
	require.NoError(t, err)
	require.Zero(t, calls, "nothing refused, nothing reclaimed")
	big, err := p.get(4 << 20)
	require.NoError(t, err, "the other pool's kept registration gave way")
	require.Equal(t, 1, calls)
	require.Len(t, big.buf, 4<<20)
	require.False(t, other.dropKept(), "the other pool keeps nothing now")

	_, err = p.get(8 << 20) // nothing left to reclaim: the kernel's error
	require.ErrorIs(t, err, syscall.ENOMEM)
	require.Equal(t, 2, calls)
	require.NoError(t, p.put(small))
	require.NoError(t, p.put(big))
	require.NoError(t, other.close())
}

// A registration the device refuses to deregister stays counted, and the
// pool's close tries it again: before, it left the pool's lists and the
// process's buffer bytes at once, still registered, out of anyone's reach.
func TestPoolKeepsRefusedDeregistration(t *testing.T) {
	regs := &fakeRegs{}
	p := newPoolOn(regs.register)
	now := time.Unix(1000, 0)
	p.now = func() time.Time { return now }
	p.idle = time.Hour
	bytes0 := globalStats.bufferBytes.Load()
	big, err := p.get(2 << 20)
	require.NoError(t, err)
	big.own.(*fakeReg).refusals = 2
	require.NoError(t, p.put(big))
	now = now.Add(2 * time.Hour)
	p.trimIdle() // the first refusal
	require.Equal(t, 1, regs.live)
	require.EqualValues(t, 2<<20, globalStats.bufferBytes.Load()-bytes0, "still registered, still counted")
	require.ErrorIs(t, p.close(), syscall.EBUSY, "the second refusal")
	require.Equal(t, 1, regs.live)
	require.NoError(t, p.close(), "tried again")
	require.Zero(t, regs.live)
	require.Equal(t, bytes0, globalStats.bufferBytes.Load())
}

func TestPoolCloseDeregistersAll(t *testing.T) {
	regs := &fakeRegs{}
	p := newPoolOn(regs.register)
	small, err := p.get(64)
	require.NoError(t, err)
	big, err := p.get(2 << 20)
	require.NoError(t, err)
	require.NoError(t, p.put(small))
	require.NoError(t, p.put(big))
	require.Equal(t, 2, regs.live)
	require.NoError(t, p.close())
	require.Zero(t, regs.live)
	require.Nil(t, p.trim, "close stops the trim timer")
}
