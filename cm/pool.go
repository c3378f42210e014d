package cm

import (
	"errors"
	"math/bits"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/goxrc/goxrc/verbs"
)

// Connection buffers come from a per-device pool instead of a registration
// of their own: mapping, pinning, zeroing and registering memory, and undoing
// it all on close, cost more system time than the rest of a connection's
// setup (at the default sizes, 9 MiB a side, some four times the
// rest under emulation: BenchmarkCMDialChurn). The pool registers large
// chunks and carves them into blocks of one size; a freed block waits for
// the next connection of that size. Chunks stay registered while the device cache
// lives (as long as any connection on the device does) and are deregistered
// with it.
//
// Buffers over poolMaxBlock get a registration of their own, which is not
// carved: a freed one is kept for the next connection of its size class,
// for bigIdle at most and up to bigCacheBytes in all, so a few big
// connections do not pin memory for the device's lifetime, and a
// registration that fails for want of lockable memory first gives back the
// kept ones, then what the rest of the process keeps (reclaim: other
// devices' kept registrations, and idle devices).
//
// Blocks hold only local-write buffers: the peer never gets their keys, so
// connections sharing a chunk, or a kept registration one after another,
// cannot reach each other's memory.

const (
	// blockAlign keeps blocks on their own cache lines.
	blockAlign = 64
	// poolMaxBlock is the largest block carved from chunks; larger ones
	// are registrations of their own, in classes of bigClass bytes.
	poolMaxBlock = 1 << 20
	bigClass     = 1 << 20
	// Chunks hold about chunkBlocks blocks, within these bounds.
	chunkBlocks  = 32
	minChunkSize = 64 << 10
	maxChunkSize = 4 << 20
	// A freed registration of its own is kept this long, and kept ones
	// total at most bigCacheBytes (fourteen connections' buffers at the
	// default sizes).
	bigIdle       = 10 * time.Second
	bigCacheBytes = 128 << 20
)

// registration is registered memory: a *verbs.MR, or a test's fake.
type registration interface {
	Bytes() []byte
	Addr() uint64
	LKey() uint32
	Close() error
}

// regBlock is registered memory for one connection's buffers.
type regBlock struct {
	buf  []byte // len and cap are the block's size
	addr uint64
	lkey uint32
	size int          // the block size it was carved with (its class)
	own  registration // the block's own registration, for blocks over poolMaxBlock
}

// sge returns an SGE for n bytes at off in the block.
func (b *regBlock) sge(off, n int) verbs.SGE {
	return verbs.SGE{Addr: b.addr + uint64(off), Length: uint32(n), LKey: b.lkey}
}

// keptBlock is a freed block with a registration of its own.
type keptBlock struct {
	regBlock
	since time.Time
}

// regPool is a device's pool of registered buffer memory.
type regPool struct {
	register func(size int) (registration, error)
	// reclaim gives back lockable memory held elsewhere in the process
	// and reports whether there was any; it is called without mu (it
	// takes other pools' locks). nil: nothing to reclaim.
	reclaim func() bool
	now     func() time.Time
	idle    time.Duration // how long a kept registration waits

	mu        sync.Mutex
	free      map[int][]regBlock // by block size
	chunks    []registration
	kept      []keptBlock // freed own registrations, oldest first
	keptBytes int
	trim      *time.Timer // armed while kept is not empty (a run may find it emptied)
	// stuck holds the registrations the device refused to deregister,
	// still registered and counted, for close to try again.
	stuck  []registration
	closed bool
}

func newRegPool(pd *verbs.PD) *regPool {
	return newPoolOn(func(size int) (registration, error) {
		mr, err := pd.RegMR(size, verbs.AccessLocalWrite)
		if err != nil {
			return nil, err
		}
		return mr, nil
	})
}

func newPoolOn(register func(size int) (registration, error)) *regPool {
	return &regPool{register: register, now: time.Now, idle: bigIdle, free: map[int][]regBlock{}}
}

// get returns a block of at least size bytes. A registration the kernel
// refuses for want of lockable memory is tried once more after reclaim.
func (p *regPool) get(size int) (regBlock, error) {
	b, err := p.take(size)
	if errors.Is(err, syscall.ENOMEM) && p.reclaim != nil && p.reclaim() {
		b, err = p.take(size)
	}
	return b, err
}

func (p *regPool) take(size int) (regBlock, error) {
	if size <= 0 {
		return regBlock{}, errors.New("empty buffer")
	}
	// Classes are powers of two: a peer's hello chooses our sizes (its
	// queue depth and message size bound ours), and chunks of a class
	// stay for the device's lifetime, so any-size classes would let a
	// stream of odd hellos pin a new chunk each. This way there are at most
	// a dozen classes (blockAlign to poolMaxBlock).
	bsize := max(blockAlign, 1<<bits.Len(uint(size-1)))
	p.mu.Lock()
	defer p.mu.Unlock()
	if bsize > poolMaxBlock {
		return p.getOwnLocked((size + bigClass - 1) / bigClass * bigClass)
	}
	free := p.free[bsize]
	if len(free) == 0 {
		if err := p.grow(bsize); err != nil {
			return regBlock{}, err
		}
		free = p.free[bsize]
	}
	b := free[len(free)-1]
	p.free[bsize] = free[:len(free)-1]
	return b, nil
}

// getOwnLocked returns a kept registration of size bytes, the most recently
// freed, or a new one.
func (p *regPool) getOwnLocked(size int) (regBlock, error) {
	for i := len(p.kept) - 1; i >= 0; i-- {
		if k := p.kept[i]; k.size == size {
			p.kept = slices.Delete(p.kept, i, i+1)
			p.keptBytes -= size
			globalStats.bufferBytesKept.Add(-int64(size))
			return k.regBlock, nil
		}
	}
	reg, err := p.registerLocked(size)
	if err != nil {
		return regBlock{}, err
	}
	return regBlock{buf: reg.Bytes()[:size:size], addr: reg.Addr(), lkey: reg.LKey(), size: size, own: reg}, nil
}

// grow registers a chunk and carves it into free blocks of bsize; p.mu is
// held.
func (p *regPool) grow(bsize int) error {
	page := os.Getpagesize()
	csize := min(max(bsize*chunkBlocks, minChunkSize), maxChunkSize)
	csize = (csize + page - 1) / page * page
	reg, err := p.registerLocked(csize)
	if err != nil {
		return err
	}
	p.chunks = append(p.chunks, reg)
	mem, addr, lkey := reg.Bytes(), reg.Addr(), reg.LKey()
	free := p.free[bsize]
	for off := 0; off+bsize <= len(mem); off += bsize {
		free = append(free, regBlock{
			buf: mem[off : off+bsize : off+bsize], addr: addr + uint64(off), lkey: lkey, size: bsize,
		})
	}
	p.free[bsize] = free
	return nil
}

// registerLocked registers size bytes. Where the kernel has no lockable
// memory left (RLIMIT_MEMLOCK), the kept registrations go first and it
// tries once more.
func (p *regPool) registerLocked(size int) (registration, error) {
	reg, err := p.register(size)
	if errors.Is(err, syscall.ENOMEM) && len(p.kept) > 0 {
		p.dropKeptLocked(len(p.kept))
		reg, err = p.register(size)
	}
	if err != nil {
		return nil, err
	}
	globalStats.bufferBytes.Add(int64(len(reg.Bytes())))
	globalStats.bufferRegs.Add(1)
	return reg, nil
}

// put returns a block; the device must be done with it (its QP destroyed
// or reset).
func (p *regPool) put(b regBlock) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if b.own == nil {
		if !p.closed { // closed, the chunk went with the pool
			p.free[b.size] = append(p.free[b.size], b)
		}
		return nil
	}
	if p.closed || b.size > bigCacheBytes {
		return p.deregister(b.own)
	}
	p.kept = append(p.kept, keptBlock{regBlock: b, since: p.now()})
	p.keptBytes += b.size
	globalStats.bufferBytesKept.Add(int64(b.size))
	var err error
	if over := p.keptBytes - bigCacheBytes; over > 0 {
		n := 0
		for ; over > 0; n++ {
			over -= p.kept[n].size
		}
		err = p.dropKeptLocked(n)
	}
	if p.trim == nil && len(p.kept) > 0 {
		p.trim = time.AfterFunc(p.idle, p.trimIdle)
	}
	return err
}

// trimIdle deregisters the registrations kept longer than p.idle, and runs
// again when the next one is due.
func (p *regPool) trimIdle() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.trim = nil
	if p.closed {
		return
	}
	now := p.now()
	n := 0
	for n < len(p.kept) && now.Sub(p.kept[n].since) >= p.idle {
		n++
	}
	p.dropKeptLocked(n)
	if len(p.kept) > 0 {
		p.trim = time.AfterFunc(p.kept[0].since.Add(p.idle).Sub(now), p.trimIdle)
	}
}

// dropKept deregisters every kept registration, for a registration of
// other memory on the device that the kernel refused for want of lockable
// memory; it reports whether there was any.
func (p *regPool) dropKept() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := len(p.kept)
	p.dropKeptLocked(n)
	return n > 0
}

// dropKeptLocked deregisters the n oldest kept registrations.
func (p *regPool) dropKeptLocked(n int) error {
	var errs []error
	for _, k := range p.kept[:n] {
		p.keptBytes -= k.size
		globalStats.bufferBytesKept.Add(-int64(k.size))
		errs = append(errs, p.deregister(k.own))
	}
	p.kept = slices.Delete(p.kept, 0, n)
	return errors.Join(errs...)
}

// deregister deregisters reg, which has left the pool's other lists. One
// the device refuses stays registered: it goes to stuck, still counted in
// the process's buffer bytes, for close to try again (a *verbs.MR may be
// closed again after a failure), instead of dropping out of sight.
func (p *regPool) deregister(reg registration) error {
	n := len(reg.Bytes()) // nil once closed
	if err := reg.Close(); err != nil {
		p.stuck = append(p.stuck, reg)
		return err
	}
	globalStats.bufferBytes.Add(-int64(n))
	return nil
}

// close deregisters every chunk and kept registration. Every block must be
// back.
func (p *regPool) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	if p.trim != nil {
		p.trim.Stop()
		p.trim = nil
	}
	stuck := p.stuck // each tried once here, also those dropKeptLocked adds
	p.stuck = nil
	errs := []error{p.dropKeptLocked(len(p.kept))}
	for _, reg := range append(p.chunks, stuck...) {
		errs = append(errs, p.deregister(reg))
	}
	p.chunks, p.free = nil, nil
	return errors.Join(errs...)
}
