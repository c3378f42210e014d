package xrc

import (
	"testing"
	"time"
)

// A tag drawn again while in use (counted tags came round to them after
// 2^32; random ones may draw them at any time). A dial given a live
// connection's sending tag had its VIRT_REQ taken for a retransmission of
// that connection's (the cached ACCEPT came back), failed verification, and
// its abort's FIN ended the live connection. An acceptor giving a new leg a
// live leg's tag made the new connection take the old one's messages. Both
// sources skip the tags in use.
func TestTagWrapSkipsLiveTags(t *testing.T) {
	w := newWorld(t)
	a, b := w.endpoint("10.0.93.1", 7000), w.endpoint("10.0.93.2", 7000)
	pair(t, a, b)           // the uplinks (PHYS)
	c1, d1 := pair(t, a, b) // a VIRT leg each way: their ACCEPTs are cached
	a.mu.Lock()
	a.tags.first = []uint32{c1.sendTag} // the dialer's next draw
	a.mu.Unlock()
	b.acc.tagMu.Lock()
	b.acc.tags.first = []uint32{d1.recvTag} // the acceptor's
	b.acc.tagMu.Unlock()
	accepted := make(chan *Conn, 1)
	go func() {
		d, err := b.Accept(ctxT(t, 5*time.Second))
		if err != nil {
			t.Errorf("accept: %v", err)
		}
		accepted <- d
	}()
	c2, err := a.Dial(ctxT(t, 5*time.Second), b.Addr().String())
	if err != nil {
		t.Fatalf("dial after the counters came round: %v", err)
	}
	d2 := <-accepted
	if d2 == nil {
		t.FailNow()
	}
	if c2.sendTag == c1.sendTag || d2.recvTag == d1.recvTag {
		t.Fatalf("tags handed out again: send %#x/%#x, receive %#x/%#x", c1.sendTag, c2.sendTag, d1.recvTag, d2.recvTag)
	}
	roundTrip(t, c1, d1, []byte("c1 still works"))
	roundTrip(t, c2, d2, []byte("and c2"))
	roundTrip(t, d1, c1, []byte("back on c1"))
	roundTrip(t, d2, c2, []byte("back on c2"))
}

// Tags are not guessable from one another: a process of the sender's node
// that knows a leg's incarnation and conn tag can MOVE it onto its own INI
// or fetch its cached ACCEPT (any process there may send a REQ from that
// address), and one that dials the same peer learns a tag of that peer's
// (the reverse leg's, in a one-exchange ACCEPT). With counted tags the
// others were its neighbours (found by a review). Sixteen connections'
// tags, both ends' sources: no two within 256 of each other (by chance, 4
// sets of 120 pairs each 2^9 in 2^32: a false alarm in about 18000 runs).
func TestTagsNotCounted(t *testing.T) {
	w := newWorld(t)
	a, b := w.endpoint("10.0.94.1", 7000), w.endpoint("10.0.94.2", 7000)
	var sets [4][]uint32 // a's send tags, b's receive tags, b's send tags, a's receive tags
	for range 16 {
		c, d := pair(t, a, b)
		sets[0] = append(sets[0], c.sendTag)
		sets[1] = append(sets[1], d.recvTag)
		sets[2] = append(sets[2], d.sendTag)
		sets[3] = append(sets[3], c.recvTag)
	}
	for i, set := range sets {
		for j, x := range set {
			for _, y := range set[j+1:] {
				if d := int64(x) - int64(y); d > -256 && d < 256 {
					t.Fatalf("set %d: tags %#x and %#x are %d apart: %#x", i, x, y, d, set)
				}
			}
		}
	}
}

// A released tag is not drawn again while an acceptor may still remember
// the leg (its retired legs) or a message for it may be in flight.
func TestTagSourceKeepsReleasedTags(t *testing.T) {
	s := newTagSource()
	s.release(7)
	s.first = []uint32{7, 0, 9}
	if got := s.next(func(uint32) bool { return false }); got != 9 {
		t.Fatalf("drew %d, want 9: 7 was released lately, 0 is no tag", got)
	}
}

// countedTags makes e's conn tags count up from 1, as they did before they
// were random: for tests whose legs must sort in the order they were paired
// (a recovery moves legs in tag order).
func countedTags(e *Endpoint) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.tags.first = make([]uint32, 4096)
	for i := range e.tags.first {
		e.tags.first[i] = uint32(i + 1)
	}
}
