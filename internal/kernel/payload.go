package kernel

import (
	"math/bits"
	"sync"
)

// Received payloads leave the SRQ as copies (the SRQ's buffer is reposted at
// once) and live until the application's Recv copies them out. Taking those
// copies from free lists instead of the heap keeps the data path free of
// allocations per message. A free list per power-of-two size class, guarded
// by a mutex: sync.Pool would box every []byte it is given back.
const (
	minPayloadClass = 6  // 64 bytes
	maxPayloadClass = 21 // 2 MiB: the largest frame (1 MiB and its header) fits
	// payloadClassBytes bounds what one class keeps on its free list (but
	// minPayloadKept buffers), so that a burst does not pin its buffers for
	// ever: 20 MiB for all classes at most, far less in practice.
	payloadClassBytes = 1 << 20
	minPayloadKept    = 2
)

type payloadClass struct {
	mu   sync.Mutex
	free [][]byte
}

var payloadClasses [maxPayloadClass + 1]payloadClass

func payloadClassOf(n int) int {
	if n <= 1<<minPayloadClass {
		return minPayloadClass
	}
	return bits.Len(uint(n - 1))
}

// NewPayload returns a buffer of n bytes (contents undefined), from a free
// list when one of its size is there. Give it back with FreePayload once
// nothing refers to it; a buffer never given back is simply collected.
func NewPayload(n int) []byte {
	c := payloadClassOf(n)
	if c > maxPayloadClass {
		return make([]byte, n)
	}
	pc := &payloadClasses[c]
	pc.mu.Lock()
	if k := len(pc.free); k > 0 {
		b := pc.free[k-1]
		pc.free[k-1] = nil
		pc.free = pc.free[:k-1]
		pc.mu.Unlock()
		return b[:n]
	}
	pc.mu.Unlock()
	return make([]byte, n, 1<<c)
}

// FreePayload gives back a buffer that NewPayload returned (or any buffer
// whose capacity is a size class). The caller must not use it afterwards.
func FreePayload(b []byte) {
	c := payloadClassOf(cap(b))
	if cap(b) != 1<<c || c > maxPayloadClass {
		return // not one of ours
	}
	pc := &payloadClasses[c]
	pc.mu.Lock()
	if len(pc.free) < max(minPayloadKept, payloadClassBytes>>c) {
		pc.free = append(pc.free, b[:cap(b)])
	}
	pc.mu.Unlock()
}
