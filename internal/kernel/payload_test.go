package kernel

import "testing"

func TestPayloadFreeLists(t *testing.T) {
	for _, c := range []struct{ n, capacity int }{
		{0, 64}, {1, 64}, {64, 64}, {65, 128}, {69, 128}, {4096, 4096}, {4097, 8192},
		{1<<20 + 4096, 2 << 20}, {2<<20 + 1, 2<<20 + 1},
	} {
		b := NewPayload(c.n)
		if len(b) != c.n || cap(b) != c.capacity {
			t.Fatalf("NewPayload(%d): len %d cap %d, want cap %d", c.n, len(b), cap(b), c.capacity)
		}
	}

	// A buffer given back is the next one of its class handed out, at the
	// length asked for.
	b := NewPayload(100)
	b[0] = 'x'
	FreePayload(b)
	again := NewPayload(70)
	if len(again) != 70 || &again[:1][0] != &b[:1][0] {
		t.Fatalf("the freed buffer was not reused")
	}

	// Buffers of other capacities are not taken in (they would be handed
	// out short of their class).
	FreePayload(make([]byte, 100))
	FreePayload(make([]byte, 3<<20))
	if got := NewPayload(120); cap(got) != 128 {
		t.Fatalf("a foreign buffer was kept: cap %d", cap(got))
	}

	// A class keeps a bounded number of buffers.
	for class, want := range map[int]int{20: minPayloadKept, 12: payloadClassBytes >> 12} {
		pc := &payloadClasses[class]
		for range 2 * want {
			FreePayload(make([]byte, 1<<class))
		}
		pc.mu.Lock()
		kept := len(pc.free)
		pc.mu.Unlock()
		if kept != want {
			t.Fatalf("class of %d bytes keeps %d buffers, want %d", 1<<class, kept, want)
		}
	}
}
