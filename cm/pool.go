package cm

import (
	"errors"
	"math/bits"
	"os"
	"sync"

	"github.com/goxrc/goxrc/verbs"
)

// Connection buffers come from a per-device pool instead of a registration
// of their own: mapping, pinning, zeroing and registering memory, and undoing
// it all on close, cost more system time than the rest of a small
// connection's setup. The pool registers large chunks and carves them into
// blocks of one size; a freed block waits for the next connection of that
// size. Chunks stay registered while the device cache lives (as long as any
// connection on the device does) and are deregistered with it.
//
// Blocks hold only local-write buffers: the peer never gets their keys, so
// connections sharing a chunk cannot reach each other's memory.

const (
	// blockAlign keeps blocks on their own cache lines.
	blockAlign = 64
	// poolMaxBlock is the largest block the pool hands out; larger
	// buffers get a registration of their own, released with them, so a
	// few big connections do not pin memory for the device's lifetime.
	poolMaxBlock = 1 << 20
	// Chunks hold about chunkBlocks blocks, within these bounds.
	chunkBlocks  = 32
	minChunkSize = 64 << 10
	maxChunkSize = 4 << 20
)

// regBlock is registered memory for one connection's buffers.
type regBlock struct {
	buf  []byte // len and cap are the block's size
	addr uint64
	lkey uint32
	size int       // the block size it was carved with (its class)
	own  *verbs.MR // the block's own registration, for blocks over poolMaxBlock
}

// sge returns an SGE for n bytes at off in the block.
func (b *regBlock) sge(off, n int) verbs.SGE {
	return verbs.SGE{Addr: b.addr + uint64(off), Length: uint32(n), LKey: b.lkey}
}

// regPool is a device's pool of registered buffer memory.
type regPool struct {
	pd     *verbs.PD
	mu     sync.Mutex
	free   map[int][]regBlock // by block size
	chunks []*verbs.MR
}

func newRegPool(pd *verbs.PD) *regPool {
	return &regPool{pd: pd, free: map[int][]regBlock{}}
}

// get returns a block of at least size bytes.
func (p *regPool) get(size int) (regBlock, error) {
	if size <= 0 {
		return regBlock{}, errors.New("empty buffer")
	}
	// Classes are powers of two: a peer's hello chooses our sizes (its
	// queue depth and message size bound ours), and chunks of a class
	// stay for the device's lifetime, so any-size classes would let a
	// stream of odd hellos pin a new chunk each. This way there are at most
	// a dozen classes (blockAlign to poolMaxBlock).
	bsize := max(blockAlign, 1<<bits.Len(uint(size-1)))
	if bsize > poolMaxBlock {
		mr, err := p.pd.RegMR(size, verbs.AccessLocalWrite)
		if err != nil {
			return regBlock{}, err
		}
		return regBlock{buf: mr.Bytes(), addr: mr.Addr(), lkey: mr.LKey(), size: size, own: mr}, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
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

// grow registers a chunk and carves it into free blocks of bsize; p.mu is
// held.
func (p *regPool) grow(bsize int) error {
	page := os.Getpagesize()
	csize := min(max(bsize*chunkBlocks, minChunkSize), maxChunkSize)
	csize = (csize + page - 1) / page * page
	mr, err := p.pd.RegMR(csize, verbs.AccessLocalWrite)
	if err != nil {
		return err
	}
	p.chunks = append(p.chunks, mr)
	mem, addr, lkey := mr.Bytes(), mr.Addr(), mr.LKey()
	free := p.free[bsize]
	for off := 0; off+bsize <= len(mem); off += bsize {
		free = append(free, regBlock{
			buf: mem[off : off+bsize : off+bsize], addr: addr + uint64(off), lkey: lkey, size: bsize,
		})
	}
	p.free[bsize] = free
	return nil
}

// put returns a block; the device must be done with it (its QP destroyed).
func (p *regPool) put(b regBlock) error {
	if b.own != nil {
		return b.own.Close()
	}
	p.mu.Lock()
	p.free[b.size] = append(p.free[b.size], b)
	p.mu.Unlock()
	return nil
}

// close deregisters every chunk. Every block must be back.
func (p *regPool) close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	var errs []error
	for _, mr := range p.chunks {
		errs = append(errs, mr.Close())
	}
	p.chunks, p.free = nil, nil
	return errors.Join(errs...)
}
