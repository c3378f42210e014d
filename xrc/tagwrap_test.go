package xrc

import (
	"testing"
	"time"
)

// After 2^32 tags the counters come round to live connections' tags. A
// dial given a live connection's sending tag had its VIRT_REQ taken for a
// retransmission of that connection's (the cached ACCEPT came back), failed
// verification, and its abort's FIN ended the live connection. An acceptor
// giving a new leg a live leg's tag made the new connection take the old
// one's messages. Both counters now skip the tags in use.
func TestTagWrapSkipsLiveTags(t *testing.T) {
	w := newWorld(t)
	a, b := w.endpoint("10.0.93.1", 7000), w.endpoint("10.0.93.2", 7000)
	pair(t, a, b)           // the uplinks (PHYS)
	c1, d1 := pair(t, a, b) // a VIRT leg each way: their ACCEPTs are cached
	a.mu.Lock()
	a.nextTag = c1.sendTag - 1 // the dialer's counter, as after 2^32 tags
	a.mu.Unlock()
	b.acc.mu.Lock()
	b.acc.nextTag = d1.recvTag - 1 // the acceptor's
	b.acc.mu.Unlock()
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
